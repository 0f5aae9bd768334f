"""A client-side token bucket: FIFO-fair, cancellation-safe, for async tasks and threads."""

from __future__ import annotations

import asyncio
import collections
import math
import threading
import time
from collections.abc import Awaitable, Callable

from ._testing import is_testing

__all__ = ["LONGEST_PAUSE", "TokenBucket"]

LONGEST_PAUSE = 86_400.0
"""A day: the longest an adaptive bucket pauses for a server's reset, and the longest
wait `RetryTransport` starts."""

# Float refills land a hair below whole numbers; do not sleep a nanosecond for that.
_EPSILON = 1e-9


class _Waiter:
    """One caller in the queue: how many tokens it wants and how to tell it its turn came."""

    __slots__ = ("n", "wake")

    def __init__(self, n: float, wake: Callable[[], object]) -> None:
        self.n = n
        self.wake = wake


def _resolve(future: asyncio.Future[None]) -> None:
    """Mark an async waiter's turn, unless it was cancelled meanwhile."""
    if not future.done():
        future.set_result(None)


class TokenBucket:
    """Hold ``capacity`` tokens, refilled at ``rate`` per second; callers wait for theirs.

    Waiters are served first come, first served: a large request at the head
    is not overtaken by later small ones. A waiter that is cancelled leaves
    the queue without taking tokens and the next one moves up. Share one
    bucket among tasks (``await acquire(n)``) or threads (``acquire_sync(n)``),
    or give it to :class:`RetryTransport` to limit every attempt up front.

    With ``adaptive=True``, :meth:`update` (called by the transport with the
    quota headers the server sends) lowers the tokens to the server's count
    and, when the server says none are left, pauses until its reset.

    ``clock`` (monotonic seconds), ``sleep`` and ``sleep_sync`` are injectable
    so tests can move a fake clock instead of sleeping.

    >>> import asyncio, httpx
    >>> bucket = TokenBucket(rate=5.0, capacity=10)  # 5 requests a second, bursts of 10
    >>> async def call_api(client: httpx.AsyncClient, url: str) -> httpx.Response:
    ...     await bucket.acquire()  # waits its turn once the burst is spent
    ...     return await client.get(url)
    >>> asyncio.run(bucket.acquire(3))
    True
    >>> round(bucket.tokens)
    7
    """

    __slots__ = (
        "_clock",
        "_last",
        "_lock",
        "_paused_until",
        "_sleep",
        "_sleep_sync",
        "_tokens",
        "_waiters",
        "adaptive",
        "capacity",
        "rate",
    )

    def __init__(
        self,
        rate: float,
        capacity: float,
        *,
        adaptive: bool = False,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        sleep_sync: Callable[[float], None] = time.sleep,
    ) -> None:
        if isinstance(rate, bool) or not isinstance(rate, int | float) or not 0 < rate < math.inf:
            msg = f"rate must be a finite number of tokens per second > 0, got {rate!r}"
            raise ValueError(msg)
        if (isinstance(capacity, bool) or not isinstance(capacity, int | float)
                or not 0 < capacity < math.inf):
            msg = f"capacity must be a finite number > 0, got {capacity!r}"
            raise ValueError(msg)
        self.rate = float(rate)
        self.capacity = float(capacity)
        self.adaptive = adaptive
        self._clock = clock
        self._sleep = sleep
        self._sleep_sync = sleep_sync
        self._tokens = self.capacity
        self._last = clock()
        self._paused_until = -math.inf
        self._waiters: collections.deque[_Waiter] = collections.deque()
        # Guards the arithmetic only, never held across a wait, so threads and
        # the event loop can share one bucket.
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return (
            f"TokenBucket(rate={self.rate:g}/s, capacity={self.capacity:g}, "
            f"tokens={self.tokens:.3g}, waiting={len(self._waiters)})"
        )

    @property
    def tokens(self) -> float:
        """Tokens available now (not counting what queued waiters will take)."""
        with self._lock:
            self._refill(self._clock())
            return self._tokens

    @property
    def waiting(self) -> int:
        """Number of callers queued."""
        return len(self._waiters)

    async def acquire(self, n: float = 1, *, timeout: float | None = None) -> bool:
        """Wait until ``n`` tokens are available and take them, in arrival order: True.

        With ``timeout`` (seconds), give up as soon as the tokens could not be had
        within it (a pause or the callers ahead would outlast it): False, and the
        queue is left without taking any.
        """
        self._check(n)
        if is_testing():
            return True
        loop = asyncio.get_running_loop()
        turn: asyncio.Future[None] = loop.create_future()
        waiter = _Waiter(n, lambda: loop.call_soon_threadsafe(_resolve, turn))
        deadline = None if timeout is None else self._clock() + max(0.0, timeout)
        granted = False
        self._enqueue(waiter)
        try:
            while (wait := self._try_take(waiter, deadline))[0] > 0:
                if wait[0] == math.inf:
                    await turn
                elif wait[1]:
                    await self._sleep(wait[0])
                else:  # behind others: woken when first, or looked at again by the deadline
                    await asyncio.wait([turn], timeout=wait[0])
            granted = wait[0] == 0
        finally:
            if not granted:
                self._leave(waiter)
        return granted

    def acquire_sync(self, n: float = 1, *, timeout: float | None = None) -> bool:
        """Block the calling thread until ``n`` tokens are available and take them
        (``timeout``: as for `acquire`)."""
        self._check(n)
        if is_testing():
            return True
        turn = threading.Event()
        waiter = _Waiter(n, turn.set)
        deadline = None if timeout is None else self._clock() + max(0.0, timeout)
        granted = False
        self._enqueue(waiter)
        try:
            while (wait := self._try_take(waiter, deadline))[0] > 0:
                if wait[0] == math.inf:
                    turn.wait()
                elif wait[1]:
                    self._sleep_sync(wait[0])
                else:
                    turn.wait(wait[0])
            granted = wait[0] == 0
        finally:
            if not granted:
                self._leave(waiter)
        return granted

    def delay(self, n: float = 1, *, after: float = 0.0) -> float:
        """Seconds beyond ``after`` that a caller arriving ``after`` seconds from now would
        wait for ``n`` tokens, behind the callers queued now and any pause, if no one
        else came (an estimate, for fitting a wait into a time budget)."""
        with self._lock:
            now = self._clock()
            self._refill(now)
            wanted = sum(waiter.n for waiter in self._waiters) + n - self._tokens
            start = max(now, self._paused_until)
            ready = start + max(0.0, wanted) / self.rate
            return max(0.0, ready - (now + after))

    def update(self, remaining: int | None, reset_after: float | None = None) -> None:
        """Follow the server (if ``adaptive``): at most ``remaining`` tokens, none until reset.

        ``remaining`` is the server's count of requests left, ``reset_after``
        the seconds until its quota restores; a pause only starts when
        ``remaining`` is 0 and the reset at most `LONGEST_PAUSE` away (one further off
        is a misread header, such as an epoch sent as a duration, or a hostile one: it
        would stop every caller for years). A non-adaptive bucket ignores this.
        """
        if not self.adaptive:
            return
        with self._lock:
            now = self._clock()
            self._refill(now)
            if remaining is not None:
                self._tokens = min(self._tokens, float(remaining))
                if remaining == 0 and reset_after is not None and reset_after <= LONGEST_PAUSE:
                    self._paused_until = max(self._paused_until, now + reset_after)
                    self._last = max(self._last, now)

    def _check(self, n: float) -> None:
        """Reject requests that could never be served."""
        if not (0 < n <= self.capacity):
            msg = (
                f"cannot acquire {n!r} tokens from a bucket of capacity {self.capacity:g}; "
                f"ask for more than 0 and at most the capacity"
            )
            raise ValueError(msg)

    def _enqueue(self, waiter: _Waiter) -> None:
        """Join the end of the queue."""
        with self._lock:
            self._waiters.append(waiter)

    def _try_take(self, waiter: _Waiter, deadline: float | None = None) -> tuple[float, bool]:
        """Take the tokens if ``waiter`` is first and they are there (0), else how long
        to wait: for the first, until its tokens are there; for the others, until woken
        (``math.inf``), or with a ``deadline``, at most until it. Negative: the tokens
        could not be had by the deadline. With it, whether ``waiter`` is first, as seen
        under the lock (looked at after it, a waiter that had just moved up would sleep
        as first until its deadline, and hold up everyone behind it).

        Only the first ever gets 0, having taken its tokens: one behind others at its
        deadline gives up (told to wait 0, it took itself for served and stayed queued,
        and the queue stalled behind it when it came first).
        """
        with self._lock:
            now = self._clock()
            self._refill(now)
            pause = max(0.0, self._paused_until - now)
            if self._waiters[0] is waiter:
                missing = waiter.n - self._tokens
                if pause <= 0 and missing <= _EPSILON:
                    self._tokens = max(0.0, self._tokens - waiter.n)
                    self._waiters.popleft()
                    self._wake_head()
                    return 0.0, True
                wait = pause + max(0.0, missing) / self.rate
                return (-1.0 if deadline is not None and now + wait > deadline else wait), True
            if deadline is None:
                return math.inf, False
            wanted = -self._tokens
            for queued in self._waiters:
                wanted += queued.n
                if queued is waiter:
                    break
            if now >= deadline or now + pause + max(0.0, wanted) / self.rate > deadline:
                return -1.0, False
            return deadline - now, False

    def _leave(self, waiter: _Waiter) -> None:
        """Drop a waiter that gave up; if it was first, let the next one try."""
        with self._lock:
            if waiter not in self._waiters:
                return
            was_head = self._waiters[0] is waiter
            self._waiters.remove(waiter)
            if was_head:
                self._wake_head()

    def _wake_head(self) -> None:
        """Tell the first waiter it is its turn."""
        if self._waiters:
            self._waiters[0].wake()

    def _refill(self, now: float) -> None:
        """Add the tokens earned since the last refill; none accrue during a pause."""
        start = max(self._last, self._paused_until)
        if now > start:
            self._tokens = min(self.capacity, self._tokens + (now - start) * self.rate)
        self._last = max(self._last, now)

"""A client-side token bucket: FIFO-fair, cancellation-safe, for async tasks and threads."""

from __future__ import annotations

import collections
import math
import threading
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, NamedTuple

from . import aio
from .testing import is_testing

if TYPE_CHECKING:
    import asyncio

__all__ = ["LONGEST_PAUSE", "TokenBucket"]

LONGEST_PAUSE = 86_400.0
"""A day: the longest an adaptive bucket pauses for a server's reset, and the longest
wait `RetryTransport` starts."""

# Float refills land a hair below whole numbers; do not sleep a nanosecond for that.
_EPSILON = 1e-9


class _Waiter:
    """One caller in the queue: how many tokens it wants and how to tell it its turn came."""

    __slots__ = ("tokens", "wake")

    def __init__(self, tokens: float, wake: Callable[[], object]) -> None:
        self.tokens = tokens
        self.wake = wake


class _Turn(NamedTuple):
    """What a waiter found when it tried to take its tokens."""

    wait: float
    """0: the tokens were taken; > 0: seconds to wait before trying again (``math.inf``:
    until woken); < 0: the tokens cannot be had by the deadline."""
    first: bool
    """Whether the waiter is at the head of the queue."""


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
        "_lock",
        "_paused_until",
        "_refilled_at",
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
        sleep: Callable[[float], Awaitable[None]] = aio.sleep,
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
        self._refilled_at = clock()
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
        self._check_amount(n)
        if is_testing():
            return True
        import asyncio

        loop = asyncio.get_running_loop()
        woken: asyncio.Future[None] = loop.create_future()
        waiter = _Waiter(n, lambda: loop.call_soon_threadsafe(_resolve, woken))
        deadline = None if timeout is None else self._clock() + max(0.0, timeout)
        granted = False
        self._enqueue(waiter)
        try:
            while (turn := self._try_take(waiter, deadline)).wait > 0:
                if turn.wait == math.inf:
                    await woken
                elif turn.first:
                    await self._sleep(turn.wait)
                else:  # behind others: woken when first, or looked at again by the deadline
                    await asyncio.wait([woken], timeout=turn.wait)
            granted = turn.wait == 0
        finally:
            if not granted:
                self._leave(waiter)
        return granted

    def acquire_sync(self, n: float = 1, *, timeout: float | None = None) -> bool:
        """Block the calling thread until ``n`` tokens are available and take them
        (``timeout``: as for `acquire`)."""
        self._check_amount(n)
        if is_testing():
            return True
        woken = threading.Event()
        waiter = _Waiter(n, woken.set)
        deadline = None if timeout is None else self._clock() + max(0.0, timeout)
        granted = False
        self._enqueue(waiter)
        try:
            while (turn := self._try_take(waiter, deadline)).wait > 0:
                if turn.wait == math.inf:
                    woken.wait()
                elif turn.first:
                    self._sleep_sync(turn.wait)
                else:
                    woken.wait(turn.wait)
            granted = turn.wait == 0
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
            wanted = sum(waiter.tokens for waiter in self._waiters) + n - self._tokens
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
                    self._refilled_at = max(self._refilled_at, now)

    def _check_amount(self, n: float) -> None:
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

    def _try_take(self, waiter: _Waiter, deadline: float | None = None) -> _Turn:
        """Take the tokens if ``waiter`` is first and they are there, else say how long to wait.

        The first waits until its tokens are there; the others until woken, or with a
        ``deadline``, at most until it. Only the first is ever told 0, the tokens taken:
        one still behind others at its deadline is told a negative wait, so it leaves the
        queue rather than stay in it as if served. ``first`` is read under the lock with
        the wait, so the two always agree.
        """
        with self._lock:
            now = self._clock()
            self._refill(now)
            pause = max(0.0, self._paused_until - now)
            if self._waiters[0] is waiter:
                missing = waiter.tokens - self._tokens
                if pause <= 0 and missing <= _EPSILON:
                    self._tokens = max(0.0, self._tokens - waiter.tokens)
                    self._waiters.popleft()
                    self._wake_head()
                    return _Turn(0.0, first=True)
                wait = pause + max(0.0, missing) / self.rate
                late = deadline is not None and now + wait > deadline
                return _Turn(-1.0 if late else wait, first=True)
            if deadline is None:
                return _Turn(math.inf, first=False)
            wanted = -self._tokens
            for queued in self._waiters:
                wanted += queued.tokens
                if queued is waiter:
                    break
            if now >= deadline or now + pause + max(0.0, wanted) / self.rate > deadline:
                return _Turn(-1.0, first=False)
            return _Turn(deadline - now, first=False)

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
        start = max(self._refilled_at, self._paused_until)
        if now > start:
            self._tokens = min(self.capacity, self._tokens + (now - start) * self.rate)
        self._refilled_at = max(self._refilled_at, now)

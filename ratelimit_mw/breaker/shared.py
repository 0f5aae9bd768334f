"""A circuit breaker whose open state is shared, through Redis, by every process naming it.

A `CircuitBreaker` lives in its process: with ``--workers 4``, each worker opens on
its own failures only. `SharedCircuitBreaker` also writes each opening to Redis, as a
key that lives for its cooldown, and refuses calls while an opening by any process
of the same name lasts. A task reads the key every ``sync_interval`` seconds, so a
call never waits on Redis (and may miss an opening younger than that); while Redis
can't be reached, each process goes on with its own state.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from collections.abc import Callable
from typing import Any

from redis import exceptions as redis_errors
from redis.asyncio import Redis

from ..outages import OutageLog
from .circuit_breaker import CircuitBreaker, check_callable, check_number
from .core import Permit
from .state import CircuitOpenError, CircuitState

__all__ = ["SharedCircuitBreaker"]

_log = logging.getLogger("ratelimit_mw.breaker")
_FAILURES = (redis_errors.RedisError, OSError, TimeoutError)


class SharedCircuitBreaker(CircuitBreaker):
    """A `CircuitBreaker` that opens in every process when one of them opens.

    ``redis``: a ``redis.asyncio.Redis`` client or a ``redis://`` URL (the one the rate
    limits use will do); the key is ``prefix`` + the breaker's ``name``.
    ``sync_interval``: how often the shared state is read (seconds), from the first use
    on an event loop. Other keyword arguments are `CircuitBreaker`'s. Close it with
    ``await breaker.aclose()`` (the client too, when it was made from a URL).

    Another process's opening refuses calls here until its cooldown ends; then this
    process goes on in its own state (a trial call, if it had opened too).
    """

    __slots__ = ("_adopted", "_closed", "_hook", "_key", "_owns_client", "_poller",
                 "_publishing", "_redis", "_shared_until", "_sync_interval", "_tasks")

    def __init__(self, *, redis: Redis | str, prefix: str = "ratelimit:breaker:",
                 sync_interval: float = 0.25,
                 on_state_change: Callable[[CircuitState, CircuitState], None] | None = None,
                 **options: Any) -> None:
        super().__init__(on_state_change=self._changed, **options)
        check_callable("on_state_change", on_state_change)
        self._hook = on_state_change
        self._sync_interval = check_number("sync_interval (seconds)", sync_interval, low=0)
        if isinstance(redis, str):
            self._redis = Redis.from_url(redis, socket_timeout=1.0, socket_connect_timeout=1.0)
            self._owns_client = True
        elif isinstance(redis, Redis):
            self._redis = redis
            self._owns_client = False
        else:
            msg = f"redis must be a redis.asyncio.Redis client or a redis:// URL, got {redis!r}"
            raise TypeError(msg)
        self._key = f"{prefix}{self.name}"
        self._shared_until = 0.0  # on this breaker's clock: when another's opening ends
        self._adopted = False  # refusing for another process's opening
        self._poller: asyncio.Task[None] | None = None
        self._closed = False  # after aclose(): no more reading (its own state only)
        self._tasks: set[asyncio.Task[None]] = set()
        # Publishing fails at each opening of an outage of Redis: logged once for all.
        self._publishing = OutageLog(
            f"circuit {self.name!r} sharing", "breaker_share_failed",
            "each process keeps to its own breaker", logger=_log)

    @property
    def key(self) -> str:
        """The Redis key that holds an opening while it lasts."""
        return self._key

    @property
    def state(self) -> CircuitState:
        return CircuitState.OPEN if self._shared_left() > 0 else super().state

    @property
    def remaining_cooldown(self) -> float:
        return max(super().remaining_cooldown, self._shared_left())

    def try_acquire(self) -> Permit | None:
        if self._shared_left() > 0:
            return None
        return super().try_acquire()

    def acquire(self) -> Permit:
        left = self._shared_left()
        if left > 0:
            raise CircuitOpenError(left, self.name, CircuitState.OPEN)
        return super().acquire()

    async def sync(self) -> None:
        """Read the shared state now, and from now on every ``sync_interval`` seconds. The
        reads start by themselves at the first call, which may then miss an opening: await
        this at start-up (an app's lifespan) so that the first call knows of it."""
        self._start_reading()
        await self._read()

    async def aclose(self) -> None:
        """Stop reading; wait for a write under way; close the client if made here. The
        breaker goes on afterwards in this process's own state."""
        self._closed = True
        poller, self._poller = self._poller, None
        if poller is not None:
            poller.cancel()
            # A read that swallows its cancellation ends at its next round (_closed).
            await asyncio.wait([poller], timeout=2 * self._sync_interval + 1.0)
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._owns_client:
            await self._redis.aclose()

    def _shared_left(self) -> float:
        """Seconds another process's opening still lasts (its end is logged once)."""
        self._start_reading()
        left = self._shared_until - self._clock()
        if left <= 0 and self._adopted:
            self._adopted = False
            _log.info("circuit %r: open -> %s (the opening shared by another process ended)",
                      self.name, super().state)
        return max(0.0, left)

    def _start_reading(self) -> None:
        """Read the shared state every ``sync_interval`` on the running loop, from now."""
        poller = self._poller
        if not self._closed and (poller is None or poller.done()):
            with contextlib.suppress(RuntimeError):  # no running loop: a synchronous look
                self._poller = asyncio.get_running_loop().create_task(
                    self._poll(), name=f"shared breaker {self.name!r}")

    def _changed(self, old: CircuitState, new: CircuitState) -> None:
        """Every transition: write an opening to Redis (in the background), then call the
        user's hook."""
        if new is CircuitState.OPEN:
            left = super().remaining_cooldown
            try:
                task = asyncio.get_running_loop().create_task(self._publish(left))
            except RuntimeError:
                pass  # no running loop: this opening stays in this process
            else:
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)
        if self._hook is not None:
            self._hook(old, new)

    async def _poll(self) -> None:
        while not self._closed:
            await self._read()
            await asyncio.sleep(self._sync_interval)

    async def _publish(self, seconds: float) -> None:
        try:
            await self._redis.set(self._key, "open", px=max(1, math.ceil(seconds * 1000)))
        except _FAILURES as exc:
            self._publishing.failed(exc)
        else:
            self._publishing.succeeded()

    async def _read(self) -> None:
        try:
            left_ms = await self._redis.pttl(self._key)
        except _FAILURES:
            return  # Redis unreachable: each process keeps to its own state
        if not isinstance(left_ms, int) or left_ms <= 0:
            return
        now = self._clock()
        until = now + left_ms / 1000
        own = super().remaining_cooldown
        if until > now + own + 0.05 and until > self._shared_until:
            if not self._adopted and own <= 0:
                self._adopted = True
                _log.warning("circuit %r: %s -> open (opened by another process; %.1fs left)",
                             self.name, super().state, left_ms / 1000)
            self._shared_until = until

"""What to do when the storage can't answer: let requests through, refuse them, or count locally.

Every storage call runs under a timeout and behind a circuit breaker, so while the
storage is down requests don't each wait for the timeout: the breaker refuses the
call at once, and after ``recovery_interval`` seconds lets one trial call test
whether the storage is back.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol, TypeVar, get_args

from .breaker import CircuitBreaker
from .decision import Verdict
from .errors import ConfigError, StorageError
from .events import Source
from .policy import Hit
from .storage import MemoryStorage, RedisStorage, Storage

__all__ = ["FAILURE_MODES", "FailureMode", "FailureStats", "Gate", "StorageGuard", "check_mode"]

FailureMode = Literal["open", "closed", "memory"]
FAILURE_MODES: tuple[FailureMode, ...] = get_args(FailureMode)

_log = logging.getLogger("ratelimit_mw")
T = TypeVar("T")


class _Permit(Protocol):
    def record_success(self) -> None: ...
    def record_failure(self) -> None: ...
    def release(self) -> None: ...


class Gate(Protocol):
    """What the guard needs of a circuit breaker (``CircuitBreaker`` fits)."""

    def try_acquire(self) -> _Permit | None: ...

    @property
    def remaining_cooldown(self) -> float: ...


def check_mode(value: object) -> FailureMode:
    """``open``, ``closed`` or ``memory``, or a ConfigError."""
    text = str(value).strip().lower()
    for mode in FAILURE_MODES:
        if text == mode:
            return mode
    msg = f"unknown failure mode {value!r}; expected one of {', '.join(FAILURE_MODES)}"
    raise ConfigError(msg)


@dataclass(slots=True)
class FailureStats:
    """Counters of the failure policy at work (read them for metrics)."""

    failures: int = 0
    """Storage calls that failed or timed out."""
    skipped: int = 0
    """Storage calls not made because the breaker was open."""
    allowed: int = 0
    """Requests let through undecided (``open``)."""
    refused: int = 0
    """Requests answered 503 (``closed``)."""
    fallback: int = 0
    """Requests decided by the local in-memory limiter (``memory``)."""


class StorageGuard:
    """Decides through ``storage`` with a timeout and a breaker; ``None`` when it can't.

    In ``memory`` mode a failed or skipped call is decided by a local
    ``MemoryStorage`` instead, so limits still hold per process.
    """

    __slots__ = ("_bounds_itself", "breaker", "fallback", "mode", "stats", "storage", "timeout")

    def __init__(
        self,
        storage: Storage,
        *,
        mode: object = "open",
        timeout: object = 0.05,
        recovery_interval: object = 2.0,
        breaker: Gate | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        # The checked arguments are typed object: compiled, a float parameter would take
        # True for 1.0, and refuse a string with a TypeError naming neither it nor the value.
        self.mode = check_mode(mode)
        self.timeout = positive_seconds("storage timeout", timeout)
        cooldown = positive_seconds("recovery interval", recovery_interval)
        self.storage = storage
        self.breaker: Gate = breaker if breaker is not None else CircuitBreaker(
            name="ratelimit-storage", window_size=10, minimum_calls=3,
            failure_rate_threshold=50.0, cooldown=cooldown,
            probe_timeout=max(1.0, 10 * self.timeout),
        )
        self.fallback = MemoryStorage(clock=clock) if self.mode == "memory" else None
        # RedisStorage's own decide takes the timeout (one timer per batch); a subclass
        # that overrides decide gets the generic asyncio.timeout.
        self._bounds_itself = (isinstance(storage, RedisStorage)
                               and type(storage).decide is RedisStorage.decide)
        self.stats = FailureStats()

    @property
    def retry_after(self) -> int:
        """Whole seconds a refused client should wait (at least 1)."""
        return max(1, math.ceil(self.breaker.remaining_cooldown))

    async def decide(
        self, key: str, hits: Sequence[Hit], *, usage: int = 0,
    ) -> tuple[Verdict | None, Source]:
        """The verdict and where it came from: ``storage``, ``fallback`` or ``unavailable``.

        ``usage`` also adds an admitted request's units to the usage history (same call).
        """
        permit = self.breaker.try_acquire()
        if permit is None:
            self.stats.skipped += 1
            return self._degraded(key, hits, usage)
        storage = self.storage
        try:
            if self._bounds_itself:
                # It keeps the timeout itself, with one timer per pipelined batch where
                # asyncio.timeout here would cost one per request.
                verdict = await storage.decide(  # type: ignore[call-arg]
                    key, hits, usage=usage, timeout=self.timeout)
            else:
                async with asyncio.timeout(self.timeout):
                    # Without usage, the two-argument call: custom storages may predate it.
                    verdict = await (storage.decide(key, hits, usage=usage) if usage
                                     else storage.decide(key, hits))
        except Exception as exc:
            # Any failure of the storage (StorageError, TimeoutError, a bug in a custom
            # storage) is the failure policy's business, never a 500.
            permit.record_failure()
            self.stats.failures += 1
            _log.warning(
                "ratelimit_mw storage failure: event=storage_failure mode=%s error=%s",
                self.mode, describe_error(exc),
                extra={"ratelimit": {"event": "storage_failure", "mode": self.mode,
                                     "error": describe_error(exc)}},
            )
            return self._degraded(key, hits, usage)
        except BaseException:
            permit.release()
            raise
        permit.record_success()
        return verdict, "storage"

    async def read(self, call: Callable[[], Awaitable[T]]) -> T:
        """A read of the storage's (the quota endpoints'): refused at once with a
        ``StorageError`` while the breaker rests, instead of waiting out a timeout
        again. Its outcome is not counted: a slow report must not turn the decisions'
        storage off. It may take ten times the decisions' timeout, a second at least
        (then ``TimeoutError``)."""
        if self.breaker.remaining_cooldown > 0:
            msg = "the storage failed and rests for a moment (its breaker is open)"
            raise StorageError(msg)
        # Bounded, more loosely than a decision (a report may take two round trips).
        async with asyncio.timeout(max(1.0, 10 * self.timeout)):
            return await call()

    def _degraded(
        self, key: str, hits: Sequence[Hit], usage: int = 0,
    ) -> tuple[Verdict | None, Source]:
        if self.fallback is not None:
            self.stats.fallback += 1
            return self.fallback.decide_now(key, hits, usage=usage), "fallback"
        if self.mode == "open":
            self.stats.allowed += 1
        else:
            self.stats.refused += 1
        return None, "unavailable"


def positive_seconds(name: str, value: object) -> float:
    """``value`` as a positive, finite number of seconds, or a ConfigError naming it."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not (
            0 < value < math.inf):
        msg = f"{name} must be a positive number of seconds, got {value!r}"
        raise ConfigError(msg)
    return float(value)


def describe_error(exc: BaseException) -> str:
    """``Type: message`` of ``exc`` for a log line, at most 300 characters."""
    text = str(exc) or type(exc).__name__
    return f"{type(exc).__name__}: {text}"[:300]

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
from typing import Literal, TypeVar, get_args

from .breaker import CircuitBreaker, Gate
from .checks import positive_seconds
from .decision import Verdict
from .errors import ConfigError, StorageError, describe_error
from .events import Source
from .hits import Hit
from .metrics import Metrics, error_kind
from .outages import OutageLog
from .storage import MemoryStorage, Storage
from .storage.faults import FailureCause, failure_cause

__all__ = ["DEFAULT_MAX_PENDING", "FAILURE_MODES", "FailureMode", "FailureStats",
           "GuardedStorage", "check_max_pending", "check_mode"]

FailureMode = Literal["open", "closed", "memory"]
FAILURE_MODES: tuple[FailureMode, ...] = get_args(FailureMode)

_log = logging.getLogger("ratelimit_mw")
T = TypeVar("T")


DEFAULT_MAX_PENDING = 1000
"""Decisions a worker lets wait on the storage at once: at a storage timeout of 50 ms,
20 000 decisions a second; past it a held link would only pile up requests."""


def check_max_pending(value: object) -> int:
    """A whole number of decisions, 1 or more, or a ConfigError."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        msg = (f"max_pending_decisions must be a whole number of decisions, 1 or more "
               f"(default {DEFAULT_MAX_PENDING}), got {value!r}")
        raise ConfigError(msg)
    return value


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
    """Counters of the failure policy at work, since start-up (read them for metrics:
    ``middleware.limiter.guarded.stats``). Every decision made without the storage is
    counted once by its cause (``timeouts``, ``connection_errors``, ``oom_errors``,
    ``other_errors``, ``skipped``) and once by what answered it (``allowed``, ``refused``,
    ``fallback``)."""

    failures: int = 0
    """Storage calls that failed or timed out (the sum of the four causes below)."""
    timeouts: int = 0
    """Calls the storage did not answer in time."""
    connection_errors: int = 0
    """Calls that found no connection (refused, lost, reset)."""
    oom_errors: int = 0
    """Calls Redis refused because it was full (``OOM``, under ``noeviction``)."""
    other_errors: int = 0
    """Calls that failed otherwise (an error reply, a bug in a custom storage)."""
    skipped: int = 0
    """Storage calls not made because the breaker was open."""
    overloaded: int = 0
    """Storage calls not made because ``max_pending`` decisions were already waiting
    on the storage (a burst on a link that holds)."""
    allowed: int = 0
    """Requests let through undecided (``open``)."""
    refused: int = 0
    """Requests answered 503 (``closed``)."""
    fallback: int = 0
    """Requests decided by the local in-memory limiter (``memory``)."""
    episodes: int = 0
    """Outages seen: runs of decisions made without the storage, ended by an answer."""

    @property
    def without_storage(self) -> int:
        """Decisions made without the storage, whatever the cause."""
        return self.failures + self.skipped + self.overloaded

    def count(self, cause: FailureCause) -> None:
        """One failed storage call of ``cause``."""
        self.failures += 1
        if cause == "timeout":
            self.timeouts += 1
        elif cause == "connection":
            self.connection_errors += 1
        elif cause == "oom":
            self.oom_errors += 1
        else:
            self.other_errors += 1


class _Episode:
    """One outage, from the first decision made without the storage to its first answer:
    logged when it begins (with the error) and when it ends (with the counts)."""

    __slots__ = ("at_start", "began")

    def __init__(self, stats: FailureStats, began: float) -> None:
        self.at_start = _causes(stats)
        self.began = began

    def summary(self, stats: FailureStats) -> tuple[int, str]:
        """How many decisions this episode made without the storage, and by cause."""
        timeout, connection, oom, error, skipped, overloaded = (
            b - a for a, b in zip(self.at_start, _causes(stats), strict=True))
        return (timeout + connection + oom + error + skipped + overloaded,
                f"timeout={timeout} connection={connection} oom={oom} error={error} "
                f"breaker_open={skipped} overloaded={overloaded}")


def _causes(stats: FailureStats) -> tuple[int, int, int, int, int, int]:
    """The counts of decisions made without the storage, by cause."""
    return (stats.timeouts, stats.connection_errors, stats.oom_errors, stats.other_errors,
            stats.skipped, stats.overloaded)


class GuardedStorage:
    """The storage behind a timeout, a breaker and the failure policy: decides through
    ``storage``, or answers ``None`` when it can't.

    In ``memory`` mode a failed or skipped call is decided by a local
    ``MemoryStorage`` instead, so limits still hold per process.
    """

    __slots__ = ("_decides_now", "_episode", "breaker", "fallback", "max_pending", "metrics",
                 "mode", "pending", "reads", "recovery_interval", "stats", "storage", "timeout")

    def __init__(
        self,
        storage: Storage,
        *,
        mode: object = "open",
        timeout: object = 0.05,
        recovery_interval: object = 2.0,
        breaker: Gate | None = None,
        clock: Callable[[], float] = time.time,
        metrics: Metrics | None = None,
        max_pending: object = DEFAULT_MAX_PENDING,
    ) -> None:
        # Checked arguments typed object: see ``checks``.
        self.mode = check_mode(mode)
        self.max_pending = check_max_pending(max_pending)
        """Decisions that may wait on the storage at once; the next are answered by the
        failure policy at once (``FailureStats.overloaded``)."""
        self.pending = 0
        """Decisions waiting on the storage now."""
        self.timeout = positive_seconds("storage timeout", timeout)
        cooldown = positive_seconds("recovery interval", recovery_interval)
        self.recovery_interval = cooldown
        self.storage = storage
        # Whether ``storage.decide_now`` may give a verdict (else it is not worth a call).
        self._decides_now = type(storage).decide_now is not Storage.decide_now
        self.breaker: Gate = breaker if breaker is not None else CircuitBreaker(
            name="ratelimit-storage", window_size=10, minimum_calls=3,
            failure_rate_threshold=50.0, cooldown=cooldown,
            probe_timeout=max(1.0, 10 * self.timeout),
        )
        self.fallback = MemoryStorage(clock=clock) if self.mode == "memory" else None
        self.stats = FailureStats()
        self._episode: _Episode | None = None  # the outage going on, if any
        self.reads = OutageLog(
            "quota read", "quota_unavailable", "the quota endpoints answer 503",
            recovered="quota_recovered")
        """The outages of ``read``, logged once each (the decisions' are ``_episode``)."""
        self.metrics = metrics
        """Told each decision's storage call time and failures, and the breaker's state."""
        if metrics is not None and isinstance(self.breaker, CircuitBreaker):
            metrics.watch(self.breaker)

    @property
    def retry_after(self) -> int:
        """Whole seconds a refused client should wait (at least 1): until the breaker's
        next trial call. While the breaker is open, the rest of its cooldown; before it
        opens (the first failures) or while a trial runs, a whole ``recovery_interval``,
        when a breaker opening now would try the storage again."""
        left = self.breaker.remaining_cooldown
        return max(1, math.ceil(left if left > 0 else self.recovery_interval))

    def decide_now(self, key: str, hits: Sequence[Hit], usage: int = 0) -> Verdict | None:
        """The storage's verdict without awaiting, where it gives one (one in this
        process, which a breaker and a timeout have nothing to guard), counted in the
        metrics but not timed; None to await ``decide``."""
        if not self._decides_now:
            return None
        storage = self.storage
        # The memory storage named: compiled, called directly rather than through
        # Python's protocol (about 250 instructions a request).
        verdict = (MemoryStorage.decide_now(storage, key, hits, usage)
                   if type(storage) is MemoryStorage else storage.decide_now(key, hits, usage))
        metrics = self.metrics
        if metrics is not None and verdict is not None:
            metrics.storage_call_in_place()
        return verdict

    async def decide(
        self, key: str, hits: Sequence[Hit], *, usage: int = 0,
    ) -> tuple[Verdict | None, Source]:
        """The verdict and where it came from: ``storage``, ``fallback`` or ``unavailable``.

        ``usage`` also adds an admitted request's units to the usage history (same call).
        """
        if self.pending >= self.max_pending:
            # A link that holds fills the worker with waiting requests: past the bound,
            # answer now rather than queue more (the breaker is not told: no call made).
            if self._episode is None:
                self._begin(f"max_pending={self.max_pending} decisions wait on the storage")
            self.stats.overloaded += 1
            if self.metrics is not None:
                self.metrics.storage_error("overloaded")
            return self._degraded(key, hits, usage)
        permit = self.breaker.try_acquire()
        if permit is None:
            if self._episode is None:
                self._begin("the breaker is open")
            self.stats.skipped += 1
            return self._degraded(key, hits, usage)
        metrics = self.metrics
        started = time.perf_counter() if metrics is not None else 0.0
        self.pending += 1
        try:
            # Without a keyword when it is 0 (most calls): a storage's compiled method
            # parses keywords by name.
            verdict = await (self.storage.decide_within(self.timeout, key, hits) if not usage
                             else self.storage.decide_within(self.timeout, key, hits,
                                                             usage=usage))
        except Exception as exc:
            # Any failure of the storage (StorageError, TimeoutError, a bug in a custom
            # storage) is the failure policy's business, never a 500.
            permit.record_failure()
            if metrics is not None:
                metrics.storage_call(time.perf_counter() - started)
                metrics.storage_error(error_kind(exc))
            if self._episode is None:
                self._begin(describe_error(exc))
            self.stats.count(failure_cause(exc))
            return self._degraded(key, hits, usage)
        except BaseException:
            permit.release()
            raise
        finally:
            self.pending -= 1
        permit.record_success()
        if metrics is not None:
            metrics.storage_call(time.perf_counter() - started)
        if self._episode is not None:
            self._end(self._episode)
        return verdict, "storage"

    def _begin(self, error: str) -> None:
        """The first decision of an outage made without the storage: say so, once."""
        self._episode = _Episode(self.stats, time.monotonic())
        _log.warning(
            "ratelimit_mw storage failure: event=storage_failure mode=%s error=%s; "
            "decisions are made without the storage until it answers",
            self.mode, error,
            extra={"ratelimit": {"event": "storage_failure", "mode": self.mode,
                                 "error": error}},
        )

    def _end(self, episode: _Episode) -> None:
        """The storage answers again: the outage's count, by cause, in one line."""
        self._episode = None
        self.stats.episodes += 1
        count, causes = episode.summary(self.stats)
        seconds = time.monotonic() - episode.began
        _log.warning(
            "ratelimit_mw storage recovered: event=storage_recovered mode=%s "
            "without_storage=%d seconds=%.1f %s", self.mode, count, seconds, causes,
            extra={"ratelimit": {"event": "storage_recovered", "mode": self.mode,
                                 "without_storage": count, "seconds": seconds}},
        )

    async def read(self, call: Callable[[], Awaitable[T]]) -> T:
        """A read of the storage's (the quota endpoints'): refused at once with a
        ``StorageError`` while the breaker rests, instead of waiting out a timeout
        again. Its outcome is not counted: a slow report must not turn the decisions'
        storage off. It may take ten times the decisions' timeout, a second at least
        (then ``TimeoutError``)."""
        try:
            if self.breaker.remaining_cooldown > 0:
                msg = "the storage failed and rests for a moment (its breaker is open)"
                raise StorageError(msg)
            # Bounded, more loosely than a decision (a report may take two round trips).
            async with asyncio.timeout(max(1.0, 10 * self.timeout)):
                answer = await call()
        except (StorageError, TimeoutError) as exc:
            self.reads.failed(exc)
            raise
        self.reads.succeeded()
        return answer

    def _degraded(
        self, key: str, hits: Sequence[Hit], usage: int = 0,
    ) -> tuple[Verdict | None, Source]:
        if self.fallback is not None:
            self.stats.fallback += 1
            return self.fallback.decide_now(key, hits, usage), "fallback"
        if self.mode == "open":
            self.stats.allowed += 1
        else:
            self.stats.refused += 1
        return None, "unavailable"

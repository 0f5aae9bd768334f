"""The circuit breaker: closed, open and half-open, after resilience4j."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, Final

from mypy_extensions import mypyc_attr

from .state import BreakerWatcher, CircuitOpenError, CircuitState, refusal_in
from .windows import CountWindow, TimeWindow

__all__ = ["BreakerCore", "Permit"]

# The states as module constants: compiled, reading one is a load, where each
# ``CircuitState.CLOSED`` would be an attribute lookup through the enum's metaclass.
_CLOSED: Final = CircuitState.CLOSED
_OPEN: Final = CircuitState.OPEN
_HALF_OPEN: Final = CircuitState.HALF_OPEN

_log = logging.getLogger("ratelimit_mw.breaker")

class Permit:
    """Leave for one call through a breaker; report how the call went exactly once.

    The first report counts and later ones are ignored, so ``release()`` in a
    ``finally`` is always safe. A report is also ignored when the breaker has
    changed state since the permit was given (the call belongs to a past epoch).
    ``started`` is the breaker's clock reading when the permit was given; ``ended``,
    once ``stop_clock`` is called, when the call's time stopped (its outcome may be
    known only later: a response whose body streams after it started).
    """

    __slots__ = ("_breaker", "_done", "_epoch", "ended", "started")

    def __init__(self, breaker: BreakerCore, epoch: int, started: float) -> None:
        self._breaker = breaker
        self._epoch = epoch
        self._done = False
        self.started = started
        self.ended: float | None = None

    def stop_clock(self) -> None:
        """The call's time ends now (slow or not, and no longer a trial call that may
        run past ``probe_timeout``), though its outcome is reported later."""
        if self.ended is None:
            self.ended = self._breaker._clock()

    def record_success(self) -> None:
        """The call worked (it may still count as slow)."""
        self._finish(failed=False)

    def record_failure(self) -> None:
        """The call failed."""
        self._finish(failed=True)

    def record_exception(self, exc: BaseException) -> None:
        """The call raised ``exc``: a failure if the breaker's rules say so, else a success.

        A ``BaseException`` that is not an ``Exception`` (``asyncio.CancelledError``,
        ``KeyboardInterrupt``) says nothing about the dependency: the slot is released;
        so does a ``CircuitOpenError``, alone or in an exception group (a breaker refused
        a call made inside this one: nothing was tried).
        """
        if not isinstance(exc, Exception) or refusal_in(exc) is not None:
            self.release()
            return
        self._finish_by(self._breaker._is_failure_exception, exc)

    def record_result(self, result: object) -> None:
        """The call returned ``result``: a failure if ``is_failure_result`` says so."""
        self._finish_by(self._breaker._is_failure_result, result)

    def release(self) -> None:
        """Give the slot back without counting the call (it was cancelled or abandoned)."""
        if not self._done:
            self._done = True
            _release(self._breaker, self, self._epoch)

    def _finish_by(self, predicate: Callable[[Any], bool], value: object) -> None:
        """Finish as ``predicate(value)`` says; a predicate that raises releases the slot."""
        if self._done:
            return
        try:
            failed = predicate(value)
        except BaseException:
            self.release()
            raise
        self._finish(failed=bool(failed))

    def _finish(self, *, failed: bool) -> None:
        if not self._done:
            self._done = True
            _record(self._breaker, self, self._epoch, failed)

    def __repr__(self) -> str:
        status = "done" if self._done else "open"
        return f"<Permit of {self._breaker.name!r} epoch={self._epoch} {status}>"


@mypyc_attr(allow_interpreted_subclasses=True)
class BreakerCore:
    """The state machine of `CircuitBreaker`, compiled (it runs on every guarded call),
    built from arguments `CircuitBreaker` has already checked."""

    __slots__ = (
        "_clock",
        "_cooldown",
        "_epoch",
        "_failure_exceptions",
        "_failure_rate_threshold",
        "_is_failure",
        "_is_failure_result_fn",
        "_minimum_calls",
        "_on_state_change",
        "_opened_at",
        "_permitted",
        "_probe_slow",
        "_probe_successes",
        "_probe_timeout",
        "_probes",
        "_slow_call_duration",
        "_slow_call_rate_threshold",
        "_state",
        "_watchers",
        "_window",
        "_window_size",
        "_window_type",
        "name",
    )

    def __init__(
        self, name: str, failure_rate_threshold: float, window_type: str, window_size: int,
        minimum_calls: int, cooldown: float, permitted: int, probe_timeout: float,
        slow_call_duration: float | None, slow_call_rate_threshold: float,
        failure_exceptions: tuple[type[Exception], ...],
        is_failure: Callable[[Exception], bool] | None,
        is_failure_result: Callable[[Any], bool] | None,
        on_state_change: Callable[[CircuitState, CircuitState], None] | None,
        clock: Callable[[], float],
    ) -> None:
        self.name = name
        self._failure_rate_threshold = failure_rate_threshold
        self._slow_call_rate_threshold = slow_call_rate_threshold
        self._window_type = window_type
        self._window_size = window_size
        self._minimum_calls = minimum_calls
        self._cooldown = cooldown
        self._permitted = permitted
        self._probe_timeout = probe_timeout
        self._slow_call_duration = slow_call_duration
        self._failure_exceptions = failure_exceptions
        self._is_failure = is_failure
        self._is_failure_result_fn = is_failure_result
        self._on_state_change = on_state_change
        self._clock = clock

        self._state = _CLOSED
        self._epoch = 0  # bumped on every transition; permits of past epochs are ignored
        self._window = self._new_window()
        self._opened_at = 0.0
        self._probes: set[Permit] = set()  # trial calls in flight
        self._probe_successes = 0
        self._probe_slow = 0
        self._watchers: tuple[BreakerWatcher, ...] = ()

    def add_watcher(self, watcher: BreakerWatcher) -> None:
        """Tell ``watcher`` of every change of state and every refused call (metrics)."""
        self._watchers = (*self._watchers, watcher)

    # -- the non-raising API ------------------------------------------------------------

    @property
    def state(self) -> CircuitState:
        """The current state, after any transition the clock has made due."""
        self._refresh(self._clock())
        return self._state

    @property
    def remaining_cooldown(self) -> float:
        """Seconds until an open breaker lets trial calls through; 0.0 when not open."""
        now = self._clock()
        self._refresh(now)
        if self._state is not _OPEN:
            return 0.0
        return max(0.0, self._opened_at + self._cooldown - now)

    def try_acquire(self) -> Permit | None:
        """A permit to make one call, or None when the breaker refuses it."""
        now = self._clock()
        if self._state is _CLOSED:  # no transition falls due in time alone
            return Permit(self, self._epoch, now)
        self._refresh(now)
        if self._state is _OPEN:
            self._refused()
            return None
        permit = Permit(self, self._epoch, now)
        if self._state is _HALF_OPEN:
            if len(self._probes) + self._probe_successes >= self._permitted:
                self._refused()
                return None
            self._probes.add(permit)
        return permit

    def acquire(self) -> Permit:
        """A permit to make one call; raises `CircuitOpenError` when refused."""
        permit = self.try_acquire()
        if permit is None:
            raise CircuitOpenError(self.remaining_cooldown, self.name, self._state)
        return permit

    def reset(self) -> None:
        """Close the breaker with an empty window, whatever its state."""
        self._transition(_CLOSED, self._clock(), "reset")

    # -- bookkeeping --------------------------------------------------------------------

    def _refused(self) -> None:
        for watcher in self._watchers:
            watcher.circuit_refused(self.name)

    def _is_failure_exception(self, exc: Exception) -> bool:
        """An exception is a failure if it is one of ``failure_exceptions`` and
        ``is_failure`` (when given) agrees."""
        if not isinstance(exc, self._failure_exceptions):
            return False
        return self._is_failure is None or bool(self._is_failure(exc))

    def _is_failure_result(self, result: object) -> bool:
        """A result is a failure only if ``is_failure_result`` says so."""
        return self._is_failure_result_fn is not None and bool(self._is_failure_result_fn(result))

    def _new_window(self) -> CountWindow | TimeWindow:
        if self._window_type == "count":
            return CountWindow(self._window_size)
        return TimeWindow(self._window_size)

    def _refresh(self, now: float) -> None:
        """Make the transitions that time alone causes, each as of the moment it fell due."""
        while True:
            if self._state is _OPEN and now >= self._opened_at + self._cooldown:
                self._transition(_HALF_OPEN, now, "cooldown over")
            elif self._state is _HALF_OPEN and self._probes:
                # A trial whose clock stopped (its response started) but that never
                # ends gives its slot back at its deadline, counted neither way.
                stale = [probe for probe in self._probes if probe.ended is not None
                         and now >= probe.started + self._probe_timeout]
                self._probes.difference_update(stale)
                running = [probe.started for probe in self._probes if probe.ended is None]
                if not running:
                    return
                deadline = min(running) + self._probe_timeout
                if now < deadline:
                    return
                reason = f"a trial call ran past probe_timeout={self._probe_timeout:g}s"
                self._transition(_OPEN, deadline, reason)
            else:
                return

    def _transition(self, new: CircuitState, at: float, reason: str) -> None:
        """Enter ``new`` as of time ``at``; log it and tell the hook when the state changes."""
        old = self._state
        self._state = new
        self._epoch += 1
        self._probes.clear()
        self._probe_successes = self._probe_slow = 0
        if new is _CLOSED:
            self._window = self._new_window()
        elif new is _OPEN:
            self._opened_at = at
        if old is new:
            return
        # Opening from closed is news; a failed trial opening it again, every cooldown
        # of an outage, is not (a warning each time would flood the log).
        level = logging.WARNING if new is _OPEN and old is _CLOSED else logging.INFO
        _log.log(level, "circuit %r: %s -> %s (%s)", self.name, old, new, reason)
        for watcher in self._watchers:
            watcher.circuit_state(self.name, old, new)
        if self._on_state_change is not None:
            try:
                self._on_state_change(old, new)
            except Exception:
                # The transition has happened; a broken hook must not break the caller.
                _log.exception("circuit %r: on_state_change hook raised", self.name)

    def __repr__(self) -> str:
        now = self._clock()
        if self._state is _OPEN:
            left = max(0.0, self._opened_at + self._cooldown - now)
            detail = f"cooldown {left:.1f}s left"
        elif self._state is _HALF_OPEN:
            detail = (
                f"{len(self._probes)} trial calls running, "
                f"{self._probe_successes}/{self._permitted} passed"
            )
        else:
            calls, failures, slow_calls = self._window.totals(now)
            detail = f"{failures}/{calls} calls failed"
            if self._slow_call_duration is not None:
                detail += f", {slow_calls} slow"
        return f"<{type(self).__name__} {self.name!r} {self._state}: {detail}>"


def _record(breaker: BreakerCore, permit: Permit, epoch: int, failed: bool) -> None:
    """Count the outcome of a permitted call (a function, not a method: compiled, the
    permit calls it directly, also for breakers of an interpreted subclass)."""
    now = breaker._clock()
    trial = permit in breaker._probes  # before the refresh, which may drop it now
    if breaker._state is not _CLOSED:  # closed: nothing falls due in time
        breaker._refresh(now)
    if epoch != breaker._epoch:
        return
    ended = permit.ended if permit.ended is not None else now
    slow = breaker._slow_call_duration is not None and (
        ended - permit.started > breaker._slow_call_duration
    )
    if breaker._state is _CLOSED:
        window = breaker._window
        window.record(now, failed, slow)
        if window.clean():  # all successes, none slow: nothing could trip it
            return
        calls, failures, slow_calls = window.totals(now)
        if calls < breaker._minimum_calls:
            return
        if (rate := 100 * failures / calls) >= breaker._failure_rate_threshold:
            reason = f"failure rate {rate:.3g}% >= {breaker._failure_rate_threshold:g}%"
        elif (
            breaker._slow_call_duration is not None
            and (rate := 100 * slow_calls / calls) >= breaker._slow_call_rate_threshold
        ):
            reason = f"slow-call rate {rate:.3g}% >= {breaker._slow_call_rate_threshold:g}%"
        else:
            return
        breaker._transition(_OPEN, now, f"{reason} over {calls} calls")
    elif breaker._state is _HALF_OPEN:
        if not trial:
            return  # dropped at its deadline before it reported: counted neither way
        breaker._probes.discard(permit)
        if failed:
            breaker._transition(_OPEN, now, "a trial call failed")
            return
        breaker._probe_successes += 1
        breaker._probe_slow += slow
        if breaker._probe_successes < breaker._permitted:
            return
        rate = 100 * breaker._probe_slow / breaker._permitted
        if breaker._slow_call_duration is not None and rate >= breaker._slow_call_rate_threshold:
            reason = f"{rate:.3g}% of trial calls were slow"
            breaker._transition(_OPEN, now, reason)
        else:
            breaker._transition(_CLOSED, now, "every trial call succeeded")


def _release(breaker: BreakerCore, permit: Permit, epoch: int) -> None:
    """Free the slot of a call that ended without an outcome."""
    if epoch == breaker._epoch:
        breaker._probes.discard(permit)

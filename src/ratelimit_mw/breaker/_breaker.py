"""The circuit breaker: closed, open and half-open, after resilience4j."""

from __future__ import annotations

import functools
import inspect
import logging
import math
import time
from collections.abc import Awaitable, Callable, Coroutine
from contextvars import ContextVar
from types import TracebackType
from typing import Any, Literal, ParamSpec, TypeVar

from ._permit import Permit
from ._state import CircuitOpenError, CircuitState
from ._windows import CountWindow, TimeWindow

__all__ = ["CircuitBreaker"]

P = ParamSpec("P")
R = TypeVar("R")

_log = logging.getLogger("ratelimit_mw.breaker")

# Permits taken by ``async with breaker:``, innermost last, per task.
_ENTERED: ContextVar[tuple[tuple[CircuitBreaker, Permit], ...]] = ContextVar(
    "ratelimit_mw_breaker_entered", default=()
)


def _check_number(name: str, value: object, *, low: float, high: float = math.inf) -> float:
    """``value`` as a float in ``(low, high]``, or a ValueError naming it."""
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not low < value <= high
        or math.isinf(value)
    ):
        bounds = f"between {low:g} (excluded) and {high:g}" if high < math.inf else f"> {low:g}"
        msg = f"{name} must be a finite number {bounds}, got {value!r}"
        raise ValueError(msg)
    return float(value)


def _check_count(name: str, value: object) -> int:
    """``value`` as an int >= 1, or a ValueError naming it."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        msg = f"{name} must be an integer >= 1, got {value!r}"
        raise ValueError(msg)
    return value


def _check_callable(name: str, value: object) -> None:
    if value is not None and not callable(value):
        msg = f"{name} must be callable or None, got {value!r}"
        raise TypeError(msg)


class CircuitBreaker:
    """Stops calling a failing dependency for a while, then lets a few trial calls test it.

    CLOSED: calls go through and their outcomes fill a sliding window (the last
    ``window_size`` calls, or the calls of the last ``window_size`` seconds). Once
    the window holds ``minimum_calls`` calls, a failure rate (or slow-call rate)
    at or above its threshold, in percent, opens the breaker.
    OPEN: every call is refused with `CircuitOpenError` for ``cooldown`` seconds.
    HALF_OPEN: ``permitted_calls_in_half_open`` trial calls may run at once and the
    rest are refused; one failure opens the breaker again, and when all trials
    have succeeded (and fewer than ``slow_call_rate_threshold`` percent were slow)
    it closes with an empty window. A trial that is cancelled frees its slot; one
    still running after ``probe_timeout`` counts as failed, as of its deadline,
    so the breaker is never stuck half-open. The breaker never cancels a call
    itself: put a timeout *inside* it (a cancelled call is not a failure).

    Parameters (all keyword-only; rates in percent, times in seconds):

    - ``name``: shown in logs, errors and ``repr``.
    - ``failure_rate_threshold``: open at this failure rate or more, in ``(0, 100]``.
    - ``window_type``, ``window_size``: ``"count"`` keeps the last ``window_size`` calls;
      ``"time"`` the calls ended in the last ``window_size`` seconds (one-second buckets).
    - ``minimum_calls``: no rate is computed below this many calls in the window
      (default 10, or ``window_size`` when a count window is smaller).
    - ``cooldown``: how long OPEN refuses calls before letting trials through.
    - ``permitted_calls_in_half_open``: trial calls admitted at once, and needed to close.
    - ``probe_timeout``: a trial running longer than this counts as failed.
    - ``slow_call_duration``: a call taking longer than this is slow (None: not tracked);
      ``slow_call_rate_threshold``: open at this slow-call rate or more.
    - ``failure_exceptions``, ``is_failure``: an exception is a failure when it is one of
      these classes and ``is_failure(exc)`` (if given) is true; any other exception
      counts as a success (the dependency answered) and still propagates.
    - ``is_failure_result``: a returned value is a failure when this says so (an HTTP 5xx).
    - ``on_state_change(old, new)``: called after each change of state; errors are logged.
    - ``clock``: monotonic seconds, ``time.monotonic`` by default.

    Example::

        breaker = CircuitBreaker(name="redis", window_size=20, minimum_calls=5, cooldown=10)

        @breaker  # or ``await breaker.call(redis.get, key)``, or ``async with breaker:``
        async def cached(key: str) -> bytes | None:
            return await redis.get(key)

        try:
            value = await cached("user:1")
        except CircuitOpenError as exc:
            value = None  # Redis is resting; try again in exc.remaining seconds

    Without wrapping a function (a middleware, say)::

        permit = breaker.try_acquire()
        if permit is None:
            return unavailable(retry_after=breaker.remaining_cooldown)
        try:
            response = await forward()
        except BaseException as exc:
            permit.record_exception(exc)  # a cancellation only frees the slot
            raise
        permit.record_result(response)

    The clock is read at each call (``time.monotonic`` unless ``clock`` is given);
    timed transitions happen when the breaker is next used or its ``state`` read.
    """

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
        "_window",
        "_window_size",
        "_window_type",
        "name",
    )

    def __init__(
        self,
        *,
        name: str = "circuit",
        failure_rate_threshold: float = 50.0,
        window_type: Literal["count", "time"] = "count",
        window_size: int = 100,
        minimum_calls: int | None = None,
        cooldown: float = 30.0,
        permitted_calls_in_half_open: int = 1,
        probe_timeout: float = 10.0,
        slow_call_duration: float | None = None,
        slow_call_rate_threshold: float = 100.0,
        failure_exceptions: tuple[type[Exception], ...] = (Exception,),
        is_failure: Callable[[Exception], bool] | None = None,
        is_failure_result: Callable[[Any], bool] | None = None,
        on_state_change: Callable[[CircuitState, CircuitState], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not isinstance(name, str) or not name:
            msg = f"name must be a non-empty string, got {name!r}"
            raise ValueError(msg)
        if window_type not in ("count", "time"):
            msg = f"window_type must be 'count' or 'time', got {window_type!r}"
            raise ValueError(msg)
        window_size = _check_count("window_size", window_size)
        if minimum_calls is None:
            minimum_calls = min(10, window_size) if window_type == "count" else 10
        minimum_calls = _check_count("minimum_calls", minimum_calls)
        if window_type == "count" and minimum_calls > window_size:
            msg = (
                f"minimum_calls={minimum_calls} can never be reached in a window of the last "
                f"{window_size} calls; make it <= window_size"
            )
            raise ValueError(msg)
        if slow_call_duration is not None:
            slow_call_duration = _check_number("slow_call_duration", slow_call_duration, low=0)
        if not isinstance(failure_exceptions, tuple) or not all(
            isinstance(kind, type) and issubclass(kind, Exception) for kind in failure_exceptions
        ):
            msg = (
                f"failure_exceptions must be a tuple of Exception subclasses, got "
                f"{failure_exceptions!r} (cancellation is never a failure)"
            )
            raise TypeError(msg)
        for label, fn in (
            ("is_failure", is_failure),
            ("is_failure_result", is_failure_result),
            ("on_state_change", on_state_change),
        ):
            _check_callable(label, fn)
        if not callable(clock):
            msg = f"clock must be a callable returning monotonic seconds, got {clock!r}"
            raise TypeError(msg)

        self.name = name
        self._failure_rate_threshold = _check_number(
            "failure_rate_threshold (percent)", failure_rate_threshold, low=0, high=100
        )
        self._slow_call_rate_threshold = _check_number(
            "slow_call_rate_threshold (percent)", slow_call_rate_threshold, low=0, high=100
        )
        self._window_type = window_type
        self._window_size = window_size
        self._minimum_calls = minimum_calls
        self._cooldown = _check_number("cooldown (seconds)", cooldown, low=0)
        self._permitted = _check_count("permitted_calls_in_half_open", permitted_calls_in_half_open)
        self._probe_timeout = _check_number("probe_timeout (seconds)", probe_timeout, low=0)
        self._slow_call_duration = slow_call_duration
        self._failure_exceptions = failure_exceptions
        self._is_failure = is_failure
        self._is_failure_result_fn = is_failure_result
        self._on_state_change = on_state_change
        self._clock = clock

        self._state = CircuitState.CLOSED
        self._epoch = 0  # bumped on every transition; permits of past epochs are ignored
        self._window = self._new_window()
        self._opened_at = 0.0
        self._probes: set[Permit] = set()  # trial calls in flight
        self._probe_successes = 0
        self._probe_slow = 0

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
        if self._state is not CircuitState.OPEN:
            return 0.0
        return max(0.0, self._opened_at + self._cooldown - now)

    def try_acquire(self) -> Permit | None:
        """A permit to make one call, or None when the breaker refuses it."""
        now = self._clock()
        if self._state is CircuitState.CLOSED:  # no transition falls due in time alone
            return Permit(self, self._epoch, now)
        self._refresh(now)
        if self._state is CircuitState.OPEN:
            return None
        permit = Permit(self, self._epoch, now)
        if self._state is CircuitState.HALF_OPEN:
            if len(self._probes) + self._probe_successes >= self._permitted:
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
        self._transition(CircuitState.CLOSED, self._clock(), "reset")

    # -- the wrapping API ---------------------------------------------------------------

    async def call(self, fn: Callable[P, Awaitable[R]], /, *args: P.args, **kwargs: P.kwargs) -> R:
        """Await ``fn(*args, **kwargs)`` through the breaker; `CircuitOpenError` if refused."""
        permit = self.acquire()
        try:
            awaitable = fn(*args, **kwargs)
            if not inspect.isawaitable(awaitable):
                permit.release()  # a programming error, not a failure of the dependency
                msg = f"{fn!r} returned {awaitable!r}; the breaker guards async calls only"
                raise TypeError(msg)
            result = await awaitable
            permit.record_result(result)
        except BaseException as exc:
            permit.record_exception(exc)  # a no-op if the permit was already released
            raise
        return result

    def __call__(self, fn: Callable[P, Awaitable[R]]) -> Callable[P, Coroutine[Any, Any, R]]:
        """Decorate an async function so that every call goes through the breaker."""
        if not inspect.iscoroutinefunction(fn):
            msg = f"@{type(self).__name__} decorates async functions, got {fn!r}"
            raise TypeError(msg)

        @functools.wraps(fn)
        async def guarded(*args: P.args, **kwargs: P.kwargs) -> R:
            return await self.call(fn, *args, **kwargs)

        return guarded

    async def __aenter__(self) -> Permit:
        permit = self.acquire()
        _ENTERED.set((*_ENTERED.get(), (self, permit)))
        return permit

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        entered = _ENTERED.get()
        for index in range(len(entered) - 1, -1, -1):
            if entered[index][0] is self:
                permit = entered[index][1]
                _ENTERED.set(entered[:index] + entered[index + 1 :])
                break
        else:
            msg = f"{self!r} exited without being entered in this task"
            raise RuntimeError(msg)
        if exc is None:
            permit.record_success()  # a no-op if the body already recorded through the permit
        else:
            permit.record_exception(exc)

    # -- bookkeeping --------------------------------------------------------------------

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
            if self._state is CircuitState.OPEN and now >= self._opened_at + self._cooldown:
                self._transition(CircuitState.HALF_OPEN, now, "cooldown over")
            elif self._state is CircuitState.HALF_OPEN and self._probes:
                deadline = min(probe.started for probe in self._probes) + self._probe_timeout
                if now < deadline:
                    return
                reason = f"a trial call ran past probe_timeout={self._probe_timeout:g}s"
                self._transition(CircuitState.OPEN, deadline, reason)
            else:
                return

    def _record(self, permit: Permit, epoch: int, failed: bool) -> None:
        """Count the outcome of a permitted call."""
        now = self._clock()
        if self._state is not CircuitState.CLOSED:  # closed: nothing falls due in time
            self._refresh(now)
        if epoch != self._epoch:
            return
        slow = self._slow_call_duration is not None and (
            now - permit.started > self._slow_call_duration
        )
        if self._state is CircuitState.CLOSED:
            window = self._window
            window.record(now, failed, slow)
            if window.clean():  # all successes, none slow: nothing could trip it
                return
            calls, failures, slow_calls = window.totals(now)
            if calls < self._minimum_calls:
                return
            if (rate := 100 * failures / calls) >= self._failure_rate_threshold:
                reason = f"failure rate {rate:.3g}% >= {self._failure_rate_threshold:g}%"
            elif (
                self._slow_call_duration is not None
                and (rate := 100 * slow_calls / calls) >= self._slow_call_rate_threshold
            ):
                reason = f"slow-call rate {rate:.3g}% >= {self._slow_call_rate_threshold:g}%"
            else:
                return
            self._transition(CircuitState.OPEN, now, f"{reason} over {calls} calls")
        elif self._state is CircuitState.HALF_OPEN:
            self._probes.discard(permit)
            if failed:
                self._transition(CircuitState.OPEN, now, "a trial call failed")
                return
            self._probe_successes += 1
            self._probe_slow += slow
            if self._probe_successes < self._permitted:
                return
            rate = 100 * self._probe_slow / self._permitted
            if self._slow_call_duration is not None and rate >= self._slow_call_rate_threshold:
                reason = f"{rate:.3g}% of trial calls were slow"
                self._transition(CircuitState.OPEN, now, reason)
            else:
                self._transition(CircuitState.CLOSED, now, "every trial call succeeded")

    def _release(self, permit: Permit, epoch: int) -> None:
        """Free the slot of a call that ended without an outcome."""
        if epoch == self._epoch:
            self._probes.discard(permit)

    def _transition(self, new: CircuitState, at: float, reason: str) -> None:
        """Enter ``new`` as of time ``at``; log it and tell the hook when the state changes."""
        old = self._state
        self._state = new
        self._epoch += 1
        self._probes.clear()
        self._probe_successes = self._probe_slow = 0
        if new is CircuitState.CLOSED:
            self._window = self._new_window()
        elif new is CircuitState.OPEN:
            self._opened_at = at
        if old is new:
            return
        level = logging.WARNING if new is CircuitState.OPEN else logging.INFO
        _log.log(level, "circuit %r: %s -> %s (%s)", self.name, old, new, reason)
        if self._on_state_change is not None:
            try:
                self._on_state_change(old, new)
            except Exception:
                # The transition has happened; a broken hook must not break the caller.
                _log.exception("circuit %r: on_state_change hook raised", self.name)

    def __repr__(self) -> str:
        now = self._clock()
        if self._state is CircuitState.OPEN:
            left = max(0.0, self._opened_at + self._cooldown - now)
            detail = f"cooldown {left:.1f}s left"
        elif self._state is CircuitState.HALF_OPEN:
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

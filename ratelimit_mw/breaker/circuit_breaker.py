"""The public circuit breaker: its arguments checked, on the compiled state machine, and
the ways to wrap a call in it (``call``, the decorator, ``async with``)."""

from __future__ import annotations

import functools
import inspect
import math
import time
from collections.abc import Awaitable, Callable, Coroutine
from contextvars import ContextVar
from types import TracebackType
from typing import Any, Literal, ParamSpec, TypeVar

from .core import BreakerCore, Permit
from .state import CircuitState

__all__ = ["CircuitBreaker"]

P = ParamSpec("P")
R = TypeVar("R")

# Permits taken by ``async with breaker:``, innermost last, per task.
_ENTERED: ContextVar[tuple[tuple[CircuitBreaker, Permit], ...]] = ContextVar(
    "ratelimit_mw_breaker_entered", default=()
)


def check_number(name: str, value: object, *, low: float, high: float = math.inf) -> float:
    """``value`` as a float in ``(low, high]``, or a ValueError naming it."""
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not low < value <= high
        or value >= _HUGE  # infinity, and ints too large for a float
    ):
        bounds = f"between {low:g} (excluded) and {high:g}" if high < math.inf else f"> {low:g}"
        msg = f"{name} must be a finite number {bounds}, got {_shown(value)}"
        raise ValueError(msg)
    return float(value)


def _check_count(name: str, value: object) -> int:
    """``value`` as an int >= 1, or a ValueError naming it."""
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= _MOST_CALLS:
        msg = f"{name} must be an integer from 1 to {_MOST_CALLS:,}, got {_shown(value)}"
        raise ValueError(msg)
    return value


_HUGE = 1e300


def _shown(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 40 else f"{text[:37]}..."
_MOST_CALLS = 1_000_000  # a count window keeps one entry per call


def check_callable(name: str, value: object) -> None:
    if value is not None and not callable(value):
        msg = f"{name} must be callable or None, got {value!r}"
        raise TypeError(msg)


class CircuitBreaker(BreakerCore):
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

    # The arguments are checked here, in Python, before the compiled core sees them (see
    # ``ratelimit_mw.checks``).
    __slots__ = ()

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
            slow_call_duration = check_number("slow_call_duration", slow_call_duration, low=0)
        if not isinstance(failure_exceptions, tuple) or not all(
            isinstance(kind, type) and issubclass(kind, Exception) for kind in failure_exceptions
        ):
            msg = (
                f"failure_exceptions must be a tuple of Exception subclasses, got "
                f"{failure_exceptions!r} (cancellation is never a failure)"
            )
            raise TypeError(msg)
        if not failure_exceptions and is_failure_result is None:
            msg = ("failure_exceptions=() and no is_failure_result: no call could ever count "
                   "as a failure, so the breaker would never open")
            raise ValueError(msg)
        slow_call_rate_threshold = check_number(
            "slow_call_rate_threshold (percent)", slow_call_rate_threshold, low=0, high=100)
        if slow_call_duration is None and slow_call_rate_threshold != 100.0:
            msg = (f"slow_call_rate_threshold={slow_call_rate_threshold!r} needs "
                   f"slow_call_duration (how long a slow call takes); without it no call is slow")
            raise ValueError(msg)
        for label, fn in (
            ("is_failure", is_failure),
            ("is_failure_result", is_failure_result),
            ("on_state_change", on_state_change),
        ):
            check_callable(label, fn)
        if not callable(clock):
            msg = f"clock must be a callable returning monotonic seconds, got {clock!r}"
            raise TypeError(msg)

        super().__init__(
            name,
            check_number(
                "failure_rate_threshold (percent)", failure_rate_threshold, low=0, high=100),
            window_type,
            window_size,
            minimum_calls,
            check_number("cooldown (seconds)", cooldown, low=0),
            _check_count("permitted_calls_in_half_open", permitted_calls_in_half_open),
            check_number("probe_timeout (seconds)", probe_timeout, low=0),
            slow_call_duration,
            slow_call_rate_threshold,
            failure_exceptions,
            is_failure,
            is_failure_result,
            on_state_change,
            clock,
        )

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

"""The circuit breaker, driven by a fake monotonic clock."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import pickle
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any

import pytest

from ratelimit_mw.breaker import CircuitBreaker, CircuitOpenError, CircuitState

CLOSED, OPEN, HALF_OPEN = CircuitState.CLOSED, CircuitState.OPEN, CircuitState.HALF_OPEN


class FakeClock:
    """A monotonic clock that moves only when a test moves it (steps here are exact in binary)."""

    __slots__ = ("now",)

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def make(clock: FakeClock) -> Callable[..., CircuitBreaker]:
    def make(**options: Any) -> CircuitBreaker:
        options.setdefault("clock", clock)
        options.setdefault("name", "test")
        return CircuitBreaker(**options)

    return make


async def succeed() -> str:
    return "ok"


async def fail() -> str:
    raise ConnectionError("down")


async def run(breaker: CircuitBreaker, pattern: str) -> None:
    """Make one call per letter: ``s`` succeeds, ``f`` fails."""
    for letter in pattern:
        with contextlib.suppress(ConnectionError):
            await breaker.call(succeed if letter == "s" else fail)


async def trip(breaker: CircuitBreaker) -> None:
    """Fail calls until the breaker opens."""
    for _ in range(1000):
        if breaker.state is OPEN:
            return
        await run(breaker, "f")
    raise AssertionError(breaker)


class Gate:
    """An async function that blocks until the test opens the gate, counting its callers."""

    def __init__(self, *, fails: bool = False) -> None:
        self.started = 0
        self.finished = 0
        self.opened = asyncio.Event()
        self.fails = fails

    async def __call__(self) -> str:
        self.started += 1
        await self.opened.wait()
        self.finished += 1
        if self.fails:
            raise ConnectionError("still down")
        return "ok"


async def settle() -> None:
    """Let every ready task run until it blocks."""
    for _ in range(5):
        await asyncio.sleep(0)


@contextlib.asynccontextmanager
async def background(coro: Coroutine[Any, Any, Any]) -> AsyncIterator[asyncio.Task[Any]]:
    """Run ``coro`` as a task for the duration of the block, then cancel what is left."""
    task = asyncio.ensure_future(coro)
    await settle()
    try:
        yield task
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, ConnectionError):
            await task


# -- closed: the sliding window --------------------------------------------------------


async def test_no_rate_is_computed_before_minimum_calls(
    make: Callable[..., CircuitBreaker],
) -> None:
    """Failures below ``minimum_calls`` never open the breaker, the one that reaches it does."""
    breaker = make(minimum_calls=5, failure_rate_threshold=50)
    await run(breaker, "ffff")
    assert breaker.state is CLOSED
    await run(breaker, "f")
    assert breaker.state is OPEN


async def test_alternating_failures_open_at_fifty_percent(
    make: Callable[..., CircuitBreaker],
) -> None:
    """Failure, success, failure, success is a 50 % rate: it opens a 50 % breaker."""
    breaker = make(minimum_calls=4, window_size=10, failure_rate_threshold=50)
    await run(breaker, "fsf")
    assert breaker.state is CLOSED
    await run(breaker, "s")
    assert breaker.state is OPEN


async def test_rate_below_threshold_stays_closed(make: Callable[..., CircuitBreaker]) -> None:
    """One failure in three calls stays under a 50 % threshold."""
    breaker = make(minimum_calls=3, failure_rate_threshold=50)
    await run(breaker, "ssf" * 10)
    assert breaker.state is CLOSED


async def test_count_window_keeps_only_the_last_calls(make: Callable[..., CircuitBreaker]) -> None:
    """A count window of 3 forgets the 4th call back."""
    breaker = make(window_size=3, minimum_calls=3, failure_rate_threshold=100)
    await run(breaker, "fsff")  # window now s, f, f
    assert breaker.state is CLOSED
    await run(breaker, "f")  # window now f, f, f
    assert breaker.state is OPEN


async def test_time_window_counts_recent_failures(
    make: Callable[..., CircuitBreaker], clock: FakeClock
) -> None:
    """Failures 9 seconds old still count in a 10-second window."""
    breaker = make(window_type="time", window_size=10, minimum_calls=3, failure_rate_threshold=50)
    await run(breaker, "ff")
    clock.advance(9)
    await run(breaker, "s")
    assert breaker.state is OPEN


async def test_time_window_forgets_old_failures(
    make: Callable[..., CircuitBreaker], clock: FakeClock
) -> None:
    """Failures 10 seconds old have left a 10-second window."""
    breaker = make(window_type="time", window_size=10, minimum_calls=3, failure_rate_threshold=50)
    await run(breaker, "ff")
    clock.advance(10)
    await run(breaker, "sss")
    assert breaker.state is CLOSED
    await run(breaker, "ff")  # 2 of 5: still below 50 %
    assert breaker.state is CLOSED


async def test_exceptions_outside_failure_exceptions_count_as_successes(
    make: Callable[..., CircuitBreaker],
) -> None:
    """Only the configured exception classes are failures; the others still propagate."""
    breaker = make(minimum_calls=2, failure_exceptions=(ConnectionError,))

    async def bad_input() -> None:
        raise KeyError("no such user")

    for _ in range(5):
        with pytest.raises(KeyError):
            await breaker.call(bad_input)
    assert breaker.state is CLOSED
    await run(breaker, "ff")  # 2 of 7: the KeyErrors counted as successes
    assert breaker.state is CLOSED


async def test_is_failure_predicate_filters_exceptions(
    make: Callable[..., CircuitBreaker],
) -> None:
    """``is_failure`` narrows ``failure_exceptions`` down to the exceptions it accepts."""
    breaker = make(minimum_calls=2, is_failure=lambda exc: "timeout" in str(exc))

    async def raise_(message: str) -> None:
        raise OSError(message)

    for message in ("refused", "refused"):
        with pytest.raises(OSError):
            await breaker.call(raise_, message)
    assert breaker.state is CLOSED
    for message in ("timeout", "timeout"):
        with pytest.raises(OSError):
            await breaker.call(raise_, message)
    assert breaker.state is OPEN  # 2 of 4


async def test_results_can_count_as_failures(make: Callable[..., CircuitBreaker]) -> None:
    """A result ``is_failure_result`` rejects is a failure, yet is returned to the caller."""
    breaker = make(minimum_calls=2, is_failure_result=lambda status: status >= 500)

    async def respond(status: int) -> int:
        return status

    assert await breaker.call(respond, 200) == 200
    assert await breaker.call(respond, 404) == 404
    assert await breaker.call(respond, 503) == 503
    assert breaker.state is CLOSED  # 1 of 3
    assert await breaker.call(respond, status=502) == 502
    assert breaker.state is OPEN  # 2 of 4


async def test_slow_calls_open_the_breaker(
    make: Callable[..., CircuitBreaker], clock: FakeClock
) -> None:
    """Successful calls slower than ``slow_call_duration`` trip the slow-call rate."""
    breaker = make(minimum_calls=2, slow_call_duration=1.0, slow_call_rate_threshold=50)

    async def take(seconds: float) -> str:
        clock.advance(seconds)
        return "ok"

    await breaker.call(take, 1.0)  # exactly the limit is not slow
    await breaker.call(take, 0.2)
    assert breaker.state is CLOSED
    await breaker.call(take, 1.5)
    assert breaker.state is CLOSED  # 1 slow of 3
    await breaker.call(take, 3.0)
    assert breaker.state is OPEN  # 2 slow of 4


async def test_cancelled_call_is_not_counted(make: Callable[..., CircuitBreaker]) -> None:
    """A call cancelled in the closed state is neither a failure nor a success."""
    breaker = make(minimum_calls=1)
    gate = Gate(fails=True)
    async with background(breaker.call(gate)) as task:
        task.cancel()
        await settle()
    assert breaker.state is CLOSED
    assert "0/0 calls failed" in repr(breaker)


# -- open ------------------------------------------------------------------------------


async def test_open_breaker_never_calls_the_function(make: Callable[..., CircuitBreaker]) -> None:
    """While open, calls are refused before the function is called."""
    breaker = make(minimum_calls=1)
    await trip(breaker)
    calls = 0

    async def count() -> None:
        nonlocal calls
        calls += 1

    for _ in range(3):
        with pytest.raises(CircuitOpenError):
            await breaker.call(count)
    assert calls == 0


async def test_cooldown_runs_on_the_monotonic_clock(
    make: Callable[..., CircuitBreaker], clock: FakeClock
) -> None:
    """The error carries the cooldown left; when it is over the breaker lets trials in."""
    breaker = make(minimum_calls=1, cooldown=30)
    await trip(breaker)
    clock.advance(12)
    with pytest.raises(CircuitOpenError) as caught:
        await breaker.call(succeed)
    assert caught.value.remaining == pytest.approx(18)
    assert breaker.remaining_cooldown == pytest.approx(18)
    clock.advance(17.75)
    assert breaker.state is OPEN
    clock.advance(0.25)
    assert breaker.state is HALF_OPEN
    assert breaker.remaining_cooldown == 0.0


def test_open_error_says_what_and_for_how_long() -> None:
    """CircuitOpenError names the circuit and the wait, and survives pickling."""
    error = CircuitOpenError(12.5, "redis")
    assert isinstance(error, Exception)
    assert error.remaining == 12.5
    assert str(error) == "circuit 'redis' is open; calls are refused for another 12.5s"
    copy = pickle.loads(pickle.dumps(error))
    assert (copy.remaining, copy.name, copy.state, str(copy)) == (12.5, "redis", OPEN, str(error))


# -- half-open -------------------------------------------------------------------------


async def half_open(breaker: CircuitBreaker, clock: FakeClock, cooldown: float) -> None:
    """Trip ``breaker`` and wait out its cooldown."""
    await trip(breaker)
    clock.advance(cooldown)
    assert breaker.state is HALF_OPEN


async def test_half_open_runs_exactly_the_permitted_trials(
    make: Callable[..., CircuitBreaker], clock: FakeClock
) -> None:
    """Of 10 concurrent callers, exactly ``permitted_calls_in_half_open`` run."""
    breaker = make(minimum_calls=1, cooldown=5, permitted_calls_in_half_open=3)
    await half_open(breaker, clock, 5)
    gate = Gate()
    tasks = [asyncio.ensure_future(breaker.call(gate)) for _ in range(10)]
    await settle()
    assert gate.started == 3
    gate.opened.set()
    results = await asyncio.gather(*tasks, return_exceptions=True)
    assert results.count("ok") == 3
    refused = [result for result in results if isinstance(result, CircuitOpenError)]
    assert len(refused) == 7
    assert all(error.state is HALF_OPEN and error.remaining == 0 for error in refused)
    assert breaker.state is CLOSED


async def test_successful_trials_close_with_a_fresh_window(
    make: Callable[..., CircuitBreaker], clock: FakeClock
) -> None:
    """After the trials succeed, the failures that opened the breaker are forgotten."""
    breaker = make(minimum_calls=3, failure_rate_threshold=50, cooldown=5)
    await run(breaker, "sff")
    assert breaker.state is OPEN
    clock.advance(5)
    await run(breaker, "s")
    assert breaker.state is CLOSED
    await run(breaker, "sf")
    assert breaker.state is CLOSED  # 2 calls, below minimum_calls; 3 of 5 with the old window
    await run(breaker, "f")
    assert breaker.state is OPEN  # 2 of 3 in the fresh window


async def test_all_trials_must_succeed_before_closing(
    make: Callable[..., CircuitBreaker], clock: FakeClock
) -> None:
    """With two trials permitted, one success is not enough to close."""
    breaker = make(minimum_calls=1, cooldown=5, permitted_calls_in_half_open=2)
    await half_open(breaker, clock, 5)
    await run(breaker, "s")
    assert breaker.state is HALF_OPEN
    await run(breaker, "s")
    assert breaker.state is CLOSED


async def test_failed_trial_reopens_with_a_fresh_cooldown(
    make: Callable[..., CircuitBreaker], clock: FakeClock
) -> None:
    """A failed trial opens the breaker again, for a full cooldown from that moment."""
    breaker = make(minimum_calls=1, cooldown=30, permitted_calls_in_half_open=2)
    await half_open(breaker, clock, 30)
    await run(breaker, "s")
    clock.advance(4)
    await run(breaker, "f")
    assert breaker.state is OPEN
    assert breaker.remaining_cooldown == pytest.approx(30)


async def test_slow_trials_reopen_the_breaker(
    make: Callable[..., CircuitBreaker], clock: FakeClock
) -> None:
    """Trials that succeed but are slow at the slow-call threshold rate reopen it."""
    breaker = make(minimum_calls=1, cooldown=5, slow_call_duration=1.0)
    await half_open(breaker, clock, 5)

    async def slow() -> str:
        clock.advance(2)
        return "ok"

    assert await breaker.call(slow) == "ok"
    assert breaker.state is OPEN


async def test_hung_trial_counts_as_failed_after_probe_timeout(
    make: Callable[..., CircuitBreaker], clock: FakeClock
) -> None:
    """A trial still running after ``probe_timeout`` reopens the breaker as of its deadline."""
    breaker = make(minimum_calls=1, cooldown=30, probe_timeout=5)
    await half_open(breaker, clock, 30)
    gate = Gate()
    async with background(breaker.call(gate)):
        assert gate.started == 1
        clock.advance(4)
        with pytest.raises(CircuitOpenError) as caught:
            await breaker.call(succeed)  # the slot is still taken
        assert caught.value.state is HALF_OPEN
        clock.advance(3)
        assert breaker.state is OPEN
        assert breaker.remaining_cooldown == pytest.approx(28)  # 30 from the deadline
        clock.advance(28)
        assert await breaker.call(succeed) == "ok"  # a later caller gets through
        assert breaker.state is CLOSED
        gate.fails = True
        gate.opened.set()
        await settle()  # the hung trial ends at last; its failure is stale and ignored
        assert gate.finished == 1
    assert breaker.state is CLOSED


async def test_caller_after_a_long_hang_is_a_new_trial(
    make: Callable[..., CircuitBreaker], clock: FakeClock
) -> None:
    """When deadline and fresh cooldown have both passed, the next caller runs at once."""
    seen: list[tuple[CircuitState, CircuitState]] = []
    breaker = make(
        minimum_calls=1, cooldown=30, probe_timeout=5, on_state_change=lambda *t: seen.append(t)
    )
    await half_open(breaker, clock, 30)
    async with background(breaker.call(Gate())):
        clock.advance(3600)
        assert await breaker.call(succeed) == "ok"
    assert seen[-3:] == [(HALF_OPEN, OPEN), (OPEN, HALF_OPEN), (HALF_OPEN, CLOSED)]


async def test_cancelled_trial_frees_its_slot(
    make: Callable[..., CircuitBreaker], clock: FakeClock
) -> None:
    """A trial cancelled mid-call gives its slot to the next caller and counts for nothing."""
    breaker = make(minimum_calls=1, cooldown=5, permitted_calls_in_half_open=1)
    await half_open(breaker, clock, 5)
    gate = Gate()
    async with background(breaker.call(gate)) as task:
        with pytest.raises(CircuitOpenError):
            await breaker.call(succeed)
        task.cancel()
        await settle()
        assert task.cancelled()
    assert breaker.state is HALF_OPEN
    assert await breaker.call(succeed) == "ok"
    assert breaker.state is CLOSED


async def test_stale_permit_is_not_a_trial(
    make: Callable[..., CircuitBreaker], clock: FakeClock
) -> None:
    """A call let in while closed that ends during half-open does not count as a trial."""
    breaker = make(minimum_calls=1, cooldown=5)
    early = breaker.try_acquire()
    assert early is not None
    await half_open(breaker, clock, 5)
    early.record_success()
    assert breaker.state is HALF_OPEN
    early.record_failure()  # a second report is ignored too
    assert breaker.state is HALF_OPEN


# -- the permit API --------------------------------------------------------------------


async def test_permit_api_without_wrapping(
    make: Callable[..., CircuitBreaker], clock: FakeClock
) -> None:
    """``try_acquire`` gives permits while closed and None while open; reports count."""
    breaker = make(minimum_calls=2, failure_rate_threshold=60, cooldown=10)
    for report in ("record_success", "record_failure", "record_failure"):
        permit = breaker.try_acquire()
        assert permit is not None
        getattr(permit, report)()
    assert breaker.state is OPEN
    assert breaker.try_acquire() is None
    with pytest.raises(CircuitOpenError):
        breaker.acquire()
    clock.advance(10)
    permit = breaker.try_acquire()
    assert permit is not None
    assert breaker.try_acquire() is None  # the only trial slot is taken
    permit.release()
    permit = breaker.try_acquire()
    assert permit is not None
    permit.record_result("fine")
    assert breaker.state is CLOSED


async def test_reset_closes_with_a_fresh_window(make: Callable[..., CircuitBreaker]) -> None:
    """``reset()`` closes an open breaker and forgets its window."""
    seen: list[tuple[CircuitState, CircuitState]] = []
    breaker = make(minimum_calls=2, on_state_change=lambda *t: seen.append(t))
    await trip(breaker)
    breaker.reset()
    assert breaker.state is CLOSED
    assert breaker.remaining_cooldown == 0.0
    assert seen == [(CLOSED, OPEN), (OPEN, CLOSED)]
    await run(breaker, "f")
    assert breaker.state is CLOSED


# -- hook and log ----------------------------------------------------------------------


async def test_state_changes_reach_the_hook_and_the_log(
    make: Callable[..., CircuitBreaker], clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    """Every change of state is logged on ``ratelimit_mw.breaker`` and passed to the hook."""
    seen: list[tuple[CircuitState, CircuitState]] = []
    breaker = make(minimum_calls=2, cooldown=5, on_state_change=lambda *t: seen.append(t))
    with caplog.at_level(logging.INFO, logger="ratelimit_mw.breaker"):
        await run(breaker, "ff")
        clock.advance(5)
        await run(breaker, "s")
    assert seen == [(CLOSED, OPEN), (OPEN, HALF_OPEN), (HALF_OPEN, CLOSED)]
    records = [(r.name, r.levelno, r.getMessage()) for r in caplog.records]
    assert records == [
        (
            "ratelimit_mw.breaker",
            logging.WARNING,
            "circuit 'test': closed -> open (failure rate 100% >= 50% over 2 calls)",
        ),
        ("ratelimit_mw.breaker", logging.INFO, "circuit 'test': open -> half_open (cooldown over)"),
        (
            "ratelimit_mw.breaker",
            logging.INFO,
            "circuit 'test': half_open -> closed (every trial call succeeded)",
        ),
    ]


async def test_broken_hook_is_logged_not_raised(
    make: Callable[..., CircuitBreaker], caplog: pytest.LogCaptureFixture
) -> None:
    """A hook that raises is logged; the state still changes and the caller sees its own error."""

    def hook(old: CircuitState, new: CircuitState) -> None:
        raise RuntimeError("hook bug")

    breaker = make(minimum_calls=1, on_state_change=hook)
    with pytest.raises(ConnectionError):
        await breaker.call(fail)
    assert breaker.state is OPEN
    assert "on_state_change hook raised" in caplog.text


# -- the three wrapping forms ----------------------------------------------------------


async def test_decorator_guards_an_async_function(make: Callable[..., CircuitBreaker]) -> None:
    """``@breaker`` keeps the function's name and arguments and refuses when open."""
    breaker = make(minimum_calls=2, failure_rate_threshold=60)
    calls: list[int] = []

    @breaker
    async def fetch(item: int, *, ok: bool = True) -> int:
        """Fetch one item."""
        calls.append(item)
        if not ok:
            raise ConnectionError(item)
        return item * 2

    assert fetch.__name__ == "fetch"
    assert fetch.__doc__ == "Fetch one item."
    assert await fetch(21) == 42
    for item in (1, 2):
        with pytest.raises(ConnectionError):
            await fetch(item, ok=False)
    with pytest.raises(CircuitOpenError):
        await fetch(3)
    assert calls == [21, 1, 2]


def test_decorator_refuses_a_sync_function(make: Callable[..., CircuitBreaker]) -> None:
    """Decorating a plain function is an error at decoration time."""
    breaker = make()
    with pytest.raises(TypeError, match="async functions"):
        breaker(lambda: None)  # type: ignore[arg-type,return-value]


async def test_call_refuses_a_non_awaitable_without_counting_it(
    make: Callable[..., CircuitBreaker],
) -> None:
    """A function that returns no awaitable is a TypeError, not a dependency failure."""
    breaker = make(minimum_calls=1)
    with pytest.raises(TypeError, match="async calls only"):
        await breaker.call(lambda: 5)  # type: ignore[arg-type,return-value]
    assert breaker.state is CLOSED


async def test_context_manager_records_the_block(make: Callable[..., CircuitBreaker]) -> None:
    """``async with breaker:`` counts the block's outcome and refuses to enter when open."""
    breaker = make(minimum_calls=2, failure_rate_threshold=75)
    async with breaker:
        pass
    with pytest.raises(ConnectionError):
        async with breaker:
            raise ConnectionError
    assert breaker.state is CLOSED  # 1 of 2
    async with breaker as permit:
        permit.record_failure()  # e.g. a 503 response; the clean exit does not override it
    with pytest.raises(ConnectionError):
        async with breaker:
            raise ConnectionError
    assert breaker.state is OPEN
    entered = False
    with pytest.raises(CircuitOpenError):
        async with breaker:
            entered = True
    assert not entered


async def test_context_manager_nests_and_runs_concurrently(
    make: Callable[..., CircuitBreaker], clock: FakeClock
) -> None:
    """Nested and concurrent blocks each report through their own permit."""
    breaker = make(minimum_calls=1, cooldown=5, permitted_calls_in_half_open=2)
    await half_open(breaker, clock, 5)
    blocks_done = asyncio.Event()

    async def block() -> None:
        async with breaker:
            await blocks_done.wait()

    async with background(block()), background(block()):
        with pytest.raises(CircuitOpenError):
            async with breaker:
                pass
        blocks_done.set()
        await settle()
    assert breaker.state is CLOSED
    async with breaker, breaker:
        pass
    assert breaker.state is CLOSED


async def test_repr_shows_live_state(make: Callable[..., CircuitBreaker], clock: FakeClock) -> None:
    """``repr`` tells the state and what matters in it."""
    breaker = make(minimum_calls=3, cooldown=30, slow_call_duration=2)
    await run(breaker, "sf")
    assert repr(breaker) == "<CircuitBreaker 'test' closed: 1/2 calls failed, 0 slow>"
    await run(breaker, "f")
    clock.advance(10)
    assert repr(breaker) == "<CircuitBreaker 'test' open: cooldown 20.0s left>"
    clock.advance(20)
    assert breaker.state is HALF_OPEN
    assert repr(breaker) == "<CircuitBreaker 'test' half_open: 0 trial calls running, 0/1 passed>"


# -- configuration ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "error", "message"),
    [
        ({"failure_rate_threshold": 0}, ValueError, r"failure_rate_threshold .* got 0"),
        ({"failure_rate_threshold": 150}, ValueError, r"failure_rate_threshold .* got 150"),
        ({"failure_rate_threshold": float("nan")}, ValueError, "got nan"),
        ({"failure_rate_threshold": "50"}, ValueError, "got '50'"),
        ({"slow_call_rate_threshold": -1}, ValueError, "slow_call_rate_threshold .* got -1"),
        ({"slow_call_duration": 0}, ValueError, "slow_call_duration .* got 0"),
        ({"window_size": 0}, ValueError, "window_size must be an integer from 1 to 1,000,000, "
                                         "got 0"),
        ({"window_size": 10**20}, ValueError, "window_size must be an integer from 1 to"),
        ({"cooldown": 10**400}, ValueError,
         r"cooldown \(seconds\) must be a finite number .*\.\.\."),
        ({"probe_timeout": 10**400}, ValueError, "probe_timeout .* must be a finite number"),
        ({"window_size": 2.5}, ValueError, "window_size .* got 2.5"),
        ({"window_size": True}, ValueError, "window_size .* got True"),
        ({"window_type": "sliding"}, ValueError, "window_type .* got 'sliding'"),
        ({"minimum_calls": 0}, ValueError, "minimum_calls .* got 0"),
        ({"window_size": 5, "minimum_calls": 6}, ValueError, "minimum_calls=6 can never"),
        ({"cooldown": -5}, ValueError, r"cooldown \(seconds\) .* got -5"),
        ({"cooldown": float("inf")}, ValueError, "cooldown .* got inf"),
        ({"permitted_calls_in_half_open": 0}, ValueError, "permitted_calls_in_half_open"),
        ({"probe_timeout": 0}, ValueError, "probe_timeout .* got 0"),
        ({"name": ""}, ValueError, "name must be a non-empty string"),
        ({"failure_exceptions": ConnectionError}, TypeError, "tuple of Exception subclasses"),
        ({"failure_exceptions": (asyncio.CancelledError,)}, TypeError, "CancelledError"),
        ({"is_failure": "yes"}, TypeError, "is_failure must be callable or None, got 'yes'"),
        ({"on_state_change": 1}, TypeError, "on_state_change must be callable"),
        ({"clock": None}, TypeError, "clock must be a callable"),
    ],
)
def test_bad_configuration_is_rejected(
    options: dict[str, Any], error: type[Exception], message: str
) -> None:
    """Every bad setting is refused at construction, with its name and value."""
    with pytest.raises(error, match=message):
        CircuitBreaker(**options)


async def test_default_clock_is_monotonic_seconds() -> None:
    """Without a ``clock`` the breaker counts its cooldown on ``time.monotonic``."""
    breaker = CircuitBreaker(minimum_calls=1, cooldown=60)
    await run(breaker, "f")
    assert 59 < breaker.remaining_cooldown <= 60


def test_time_window_may_need_more_calls_than_seconds() -> None:
    """``minimum_calls`` above ``window_size`` is fine for a time window."""
    breaker = CircuitBreaker(window_type="time", window_size=5, minimum_calls=50)
    assert breaker.state is CLOSED


@pytest.mark.parametrize("failed", [False, True])
def test_a_trial_dropped_at_its_deadline_is_not_counted_later(failed: bool) -> None:
    """A half-open trial whose clock stopped and that ran past probe_timeout gave its
    slot back uncounted: its late report changes nothing (the trial after it decides)."""
    from ratelimit_mw.breaker import CircuitBreaker, CircuitState

    now = [0.0]
    breaker = CircuitBreaker(name="db", window_size=2, minimum_calls=2, cooldown=5,
                             probe_timeout=10, clock=lambda: now[0])
    for _ in range(2):
        breaker.acquire().record_failure()
    now[0] += 5
    first = breaker.acquire()
    first.stop_clock()  # its response started; its body streams on
    now[0] += 10
    second = breaker.try_acquire()
    assert second is not None
    if failed:
        first.record_failure()
    else:
        first.record_success()
    assert breaker.state is CircuitState.HALF_OPEN
    second.record_success()
    assert breaker.state is CircuitState.CLOSED

"""The five algorithms as pure functions: tables of (now, cost) -> decision rows.

Times in the tables are seconds after a start instant; the functions count in
microseconds. ``retry`` is -1 where the cost can never pass.
"""

from __future__ import annotations

import importlib
from typing import Any, get_args

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ratelimit_mw import Limit
from ratelimit_mw.algorithms import ALGORITHMS, ALIASES, NEVER_US, AlgorithmName
from ratelimit_mw.limits import ALGORITHM_NAMES, decide, run

START = 1_700_000_040_000_000  # a multiple of every window below: windows start here
S = 1_000_000

Row = tuple[float, int, bool, int, float, float]


def run_table(limit: Limit, rows: list[Row]) -> None:
    """Feed the rows in order, committing admitted states as a storage would."""
    state: Any = None
    for number, (at, cost, allowed, remaining, reset, retry) in enumerate(rows):
        step = decide(state, START + round(at * S), limit, cost)
        got = (step.allowed, step.remaining, step.reset_us / S,
               -1 if step.retry_us == NEVER_US else step.retry_us / S)
        assert got == (allowed, remaining, reset, retry), f"row {number}: {rows[number]}"
        if step.allowed and cost:
            state = step.state


def test_gcra_matches_the_redis_cell_table() -> None:
    """GCRA with capacity 5 at 1/s answers as redis-cell's own test table does."""
    run_table(Limit("1/second", "gcra", burst=5), [
        (0, 6, False, 5, 0, -1),        # larger than the burst: never
        (0, 1, True, 4, 1, 0),
        (0, 1, True, 3, 2, 0),
        (0, 1, True, 2, 3, 0),
        (0, 1, True, 1, 4, 0),
        (0, 1, True, 0, 5, 0),
        (0, 1, False, 0, 5, 1),
        (3.0, 1, True, 2, 3, 0),
        (3.1, 1, True, 1, 3.9, 0),
        (4.0, 1, True, 1, 4, 0),
        (8.0, 1, True, 4, 1, 0),
        (9.5, 1, True, 4, 1, 0),
        (9.5, 0, True, 4, 1, 0),        # cost 0 peeks
        (9.5, 2, True, 2, 3, 0),
        (9.5, 5, False, 2, 3, 3),
    ])


@pytest.mark.parametrize(("rate", "burst"), [
    ("300000/second", 3),  # T = 3 1/3 us: rounded up to 4 us it paced 250 000/s
    ("7/second", 3),       # T = 142 857 1/7 us
    ("999983/minute", 3),
    ("10000019/day", 3),
    ("10000019/day", 10_000_019),  # a tolerance too long for exact ticks: coarser ones
])
def test_gcra_keeps_the_rate_exactly(rate: str, burst: int) -> None:
    """Taking the burst, then one unit each time it is due, a GCRA admits the rate's own
    pace, not a pace rounded to whole microseconds: the n-th unit after the burst is
    due n * period / amount after it, to the microsecond (within 0.03 % where the
    ticks had to be coarser than the rate's own)."""
    limit = Limit(rate, "gcra", burst=burst)
    exact = limit.period_us * burst <= 2**52
    state = decide(None, START, limit, burst).state
    now = START
    admitted_at = []
    for _ in range(61):
        step = decide(state, now, limit, 1)
        if not step.allowed:
            now += step.retry_us
            step = decide(state, now, limit, 1)
        assert step.allowed
        state = step.state
        admitted_at.append(now)
    for n, at in enumerate(admitted_at, 1):
        due = START + -(-n * limit.period_us // limit.amount)  # the first microsecond due
        if exact:
            assert at == due, n
        else:
            assert due <= at <= due + n * limit.period_us / limit.amount * 3e-4 + 1, n


@pytest.mark.slow
@settings(max_examples=2000, deadline=None)
@given(st.integers(1, 10**12), st.integers(1, 10 * 365 * 86400 * S), st.integers(1, 10**12))
def test_gcra_ticks_keep_every_sum_exact_in_doubles(
    amount: int, period: int, capacity: int,
) -> None:
    """For every limit allowed (a refill of ten years at most), the tolerance spans at
    most 2**52 ticks: a sum of two such stays exact in Lua's doubles."""
    from ratelimit_mw.algorithms.gcra import EXACT, ticks

    if capacity * period > 10 * 365 * 86400 * S * amount:
        return
    per_us, interval = ticks(amount, period, capacity)
    assert per_us >= 1
    assert interval * capacity <= EXACT
    assert interval * amount >= period * per_us  # the pace is never above the rate


def test_token_bucket_table() -> None:
    """A bucket of 3 refilled at 1 token per 2 s: burst, then the sustained pace."""
    run_table(Limit("1/2 seconds", "token_bucket", burst=3), [
        (0, 4, False, 3, 0, -1),
        (0, 1, True, 2, 2, 0),
        (0, 2, True, 0, 6, 0),
        (0, 1, False, 0, 6, 2),
        (1, 1, False, 0, 5, 1),         # half a token back
        (2, 1, True, 0, 6, 0),
        (2, 0, True, 0, 6, 0),
        (9, 3, True, 0, 6, 0),          # refilled to the capacity, not beyond
        (10, 2, False, 0, 5, 3),
    ])


def test_fixed_window_table() -> None:
    """3 per 10 s: the window is aligned, and resets all at once."""
    run_table(Limit("3/10 seconds", "fixed_window"), [
        (0, 4, False, 3, 0, -1),
        (1, 2, True, 1, 9, 0),
        (2, 1, True, 0, 8, 0),
        (9, 1, False, 0, 1, 1),
        (9.5, 0, True, 0, 0.5, 0),
        (10, 3, True, 0, 10, 0),        # a new window: the edge allows 2x across it
        (15, 1, False, 0, 5, 5),
    ])


def test_sliding_log_table() -> None:
    """3 per 10 s, each unit expiring 10 s after it was admitted."""
    run_table(Limit("3/10 seconds", "sliding_log"), [
        (0, 4, False, 3, 0, -1),
        (0, 1, True, 2, 10, 0),
        (4, 2, True, 0, 10, 0),
        (5, 1, False, 0, 9, 5),         # the unit of t=0 expires at t=10
        (5, 2, False, 0, 9, 9),         # two units free up at t=14
        (10, 1, True, 0, 10, 0),
        (14, 0, True, 2, 6, 0),
    ])


def test_sliding_window_table() -> None:
    """10 per 10 s: the previous window counts in proportion to its overlap."""
    run_table(Limit("10/10 seconds", "sliding_window"), [
        (0, 11, False, 10, 0, -1),
        (5, 8, True, 2, 15, 0),
        (10, 2, True, 0, 20, 0),        # previous 8 weighs 8, current 2
        (11, 1, False, 0, 19, 0.25),    # 8 * 0.9 + 2 = 9.2; 1 more fits once 8 * w <= 7
        (11.25, 1, True, 0, 18.75, 0),
        (20, 0, True, 7, 10, 0),        # previous 3 weighs 3
        (30, 0, True, 10, 0, 0),
    ])


def _limit(algorithm: str, amount: int, period: int, burst: int | None) -> Limit:
    burstable = algorithm in ("token_bucket", "gcra")
    return Limit(Limit(f"{amount}/{period} seconds").rate, algorithm,  # type: ignore[arg-type]
                 burst=burst if burstable else None)


steps = st.lists(st.tuples(st.integers(0, 4 * S), st.integers(0, 4)), min_size=1, max_size=30)
shapes = st.tuples(st.sampled_from(ALGORITHM_NAMES), st.integers(1, 7), st.integers(1, 9),
                   st.one_of(st.none(), st.integers(1, 9)))


def _replay(limit: Limit, history: list[tuple[int, int]]) -> tuple[Any, int]:
    state: Any = None
    now = START + 123_457
    for gap, cost in history:
        now += gap
        step = decide(state, now, limit, cost)
        if step.allowed and cost:
            state = step.state
    return state, now


@pytest.mark.slow
@settings(max_examples=400, deadline=None)
@given(shapes, steps, st.integers(1, 7))
def test_retry_after_is_exact(shape: tuple[str, int, int, int | None],
                              history: list[tuple[int, int]], cost: int) -> None:
    """Waiting exactly retry_after admits the request; a microsecond less does not."""
    limit = _limit(*shape)
    state, now = _replay(limit, history)
    step = decide(state, now, limit, cost)
    if step.allowed:
        assert step.retry_us == 0
    elif cost > limit.capacity:
        assert step.retry_us == NEVER_US
    else:
        assert step.retry_us > 0
        assert decide(state, now + step.retry_us, limit, cost).allowed
        assert not decide(state, now + step.retry_us - 1, limit, cost).allowed


@pytest.mark.slow
@settings(max_examples=400, deadline=None)
@given(shapes, steps)
def test_remaining_counts_the_requests_that_fit_now(
    shape: tuple[str, int, int, int | None], history: list[tuple[int, int]],
) -> None:
    """``remaining`` is exactly how many cost-1 requests are admitted at this instant."""
    limit = _limit(*shape)
    state, now = _replay(limit, history)
    remaining = decide(state, now, limit, 0).remaining
    admitted = 0
    while (step := decide(state, now, limit, 1)).allowed:
        state = step.state
        admitted += 1
    assert admitted == remaining


@pytest.mark.slow
@settings(max_examples=400, deadline=None)
@given(shapes, steps)
def test_reset_after_restores_the_full_quota(
    shape: tuple[str, int, int, int | None], history: list[tuple[int, int]],
) -> None:
    """After reset_after the limit is as fresh as a key never seen."""
    limit = _limit(*shape)
    state, now = _replay(limit, history)
    reset = decide(state, now, limit, 0).reset_us
    later = now + reset
    assert decide(state, later, limit, 0)[:4] == decide(None, later, limit, 0)[:4]
    assert decide(state, later, limit, 0).remaining == limit.capacity


@pytest.mark.parametrize("algorithm", ALGORITHM_NAMES)
def test_cost_zero_never_changes_state(algorithm: str) -> None:
    """A peek returns the state it was given."""
    limit = _limit(algorithm, 3, 10, 3)
    state, now = _replay(limit, [(0, 2)])
    assert decide(state, now, limit, 0).state in (state, None)
    assert decide(state, now, limit, 0).remaining == 1


_EVERY_KIND = [*(Limit("7/minute", name, burst=9 if ALGORITHMS[name].burst else None)
                 for name in ALGORITHM_NAMES),
               Limit.concurrency(3), Limit.monthly(7)]


def test_every_registered_algorithm_is_a_kind_of_limit() -> None:
    """The registry names each algorithm once, and every one can be made into a limit."""
    assert sorted(limit.algorithm for limit in _EVERY_KIND) == sorted(ALGORITHMS)
    assert set(ALGORITHMS) == set(get_args(AlgorithmName))
    assert tuple(name for name, known in ALGORITHMS.items() if known.rate) == ALGORITHM_NAMES


@pytest.mark.parametrize("limit", _EVERY_KIND, ids=str)
def test_run_takes_each_limit_to_its_own_algorithm(limit: Limit) -> None:
    """``run`` (the memory storage's per-request call) answers as the module named after
    the limit's algorithm, state by state, for every kind of limit."""
    step = importlib.import_module(f"ratelimit_mw.algorithms.{limit.algorithm}").decide
    state: Any = None
    for n in range(12):
        now = START + n * 7 * S
        got = run(limit, state, now, 1)
        assert got == step(state, now, limit.amount, limit.period_us, limit.capacity, 1)
        if got[0]:
            state = got[4]


@pytest.mark.parametrize("alias", sorted(ALIASES))
def test_an_alias_names_its_algorithm(alias: str) -> None:
    """``leaky_bucket``, ``moving_window`` and the other aliases make the same limit as
    the registry's name."""
    name = ALIASES[alias]
    burst = 3 if ALGORITHMS[name].burst else None
    assert Limit("5/minute", alias, burst=burst) == Limit("5/minute", name, burst=burst)

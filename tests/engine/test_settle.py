"""Settling a reserved cost: the algorithms' arithmetic, on its own.

A request reserves an estimate; once its real cost is known, the difference is settled.
Settled at once, the state must answer every later question exactly as if the real
cost had been charged in the first place, for every rate algorithm; later, within the
documented bounds.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ratelimit_mw import Limit
from ratelimit_mw.algorithms import ALGORITHMS
from ratelimit_mw.limits import ALGORITHM_NAMES, decide, settle

S = 1_000_000
START = 1_700_000_000 * S + 123_456


def _limit(name: str) -> Limit:
    if name == "calendar_month":
        return Limit.monthly(7)
    return Limit("7/10 seconds", name, burst=9 if ALGORITHMS[name].burst else None)


SETTLED = [*ALGORITHM_NAMES, "calendar_month"]


def _answers(limit: Limit, state: Any, at: int) -> list[tuple[bool, int, int, int]]:
    """What ``state`` answers, costs 1 to the capacity, at ``at`` and a few later times."""
    answers = []
    for later in (0, 1, S // 3, 2 * S, 7 * S, 13 * S):
        for cost in range(1, limit.capacity + 1):
            step = decide(state, at + later, limit, cost)
            answers.append((step.allowed, step.remaining, step.reset_us, step.retry_us))
    return answers


@pytest.mark.parametrize("name", SETTLED)
@settings(max_examples=60, deadline=None)
@given(estimate=st.integers(0, 7), actual=st.integers(0, 7), offset=st.integers(0, 10 * S))
def test_settled_at_once_is_as_if_charged_the_actual_cost(
    name: str, estimate: int, actual: int, offset: int,
) -> None:
    """Reserve ``estimate`` at ``at``, settle ``actual - estimate`` at once: every later
    decision answers as if ``actual`` had been charged at ``at``."""
    limit = _limit(name)
    at = START + offset
    reserved = decide(None, at, limit, estimate)
    charged = decide(None, at, limit, actual)
    assert reserved.allowed and charged.allowed
    settled = settle(limit, reserved.state, at, at, actual - estimate)
    assert _answers(limit, settled, at) == _answers(limit, charged.state, at)


@pytest.mark.parametrize("name", ["fixed_window", "sliding_window", "sliding_log", "gcra",
                                  "token_bucket"])
def test_settled_later_with_nothing_between_is_still_exact(name: str) -> None:
    """Settled seconds later, with no request decided meanwhile: the same as charged."""
    limit = _limit(name)
    reserved = decide(None, START, limit, 2)
    charged = decide(None, START, limit, 5)
    settled = settle(limit, reserved.state, START + 3 * S, START, 3)
    assert _answers(limit, settled, START + 3 * S) == _answers(limit, charged.state,
                                                               START + 3 * S)


@pytest.mark.parametrize("name", SETTLED)
def test_a_cost_beyond_the_limit_is_debt(name: str) -> None:
    """A real cost larger than the whole limit leaves nothing (remaining 0) and denies
    later requests until the debt has gone (a window's end, or the refill)."""
    limit = _limit(name)
    reserved = decide(None, START, limit, 1)
    settled = settle(limit, reserved.state, START, START, 20)
    denied = decide(settled, START + 1, limit, 1)
    assert not denied.allowed and denied.remaining <= 0
    assert denied.retry_us > 0
    later = decide(settled, START + 1 + denied.retry_us, limit, 1)
    assert later.allowed


@pytest.mark.parametrize("name", ["token_bucket", "gcra"])
def test_a_buckets_debt_refills_at_its_rate(name: str) -> None:
    """A bucket 13 units into debt (9 of burst, 4 beyond) at 7 per 10 s admits the next
    unit once 5 units have refilled: about 7.1 s later."""
    limit = _limit(name)
    reserved = decide(None, START, limit, 1)
    settled = settle(limit, reserved.state, START, START, 12)  # 13 taken of 9
    wait = decide(settled, START, limit, 1).retry_us
    assert 7.1 * S <= wait <= 7.2 * S


@pytest.mark.parametrize("name", SETTLED)
def test_a_refund_of_an_expired_charge_changes_nothing(name: str) -> None:
    """Settled after its window (or the refill) has passed, a refund finds nothing
    left of the reservation and leaves the state answering as it did."""
    limit = _limit(name)
    reserved = decide(None, START, limit, 3)
    now = START + 40 * 86_400 * S
    settled = settle(limit, reserved.state, now, START, -3)
    assert _answers(limit, settled, now) == _answers(limit, reserved.state, now)


def test_a_concurrency_slot_has_nothing_to_settle() -> None:
    slot = Limit.concurrency(2)
    state = decide(None, START, slot, 1).state
    assert settle(slot, state, START, START, 1) is state

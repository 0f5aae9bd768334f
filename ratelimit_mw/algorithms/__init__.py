"""The five algorithms, each a pure function of (state, now, limit, cost) -> Step.

No I/O and no clock reads: storages read the clock (or Redis's) and keep the state.
Each module has a Lua twin of the same stem in ``ratelimit_mw/storage/lua``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..limits import AlgorithmName, Limit
from . import (
    calendar_month,
    concurrency,
    fixed_window,
    gcra,
    sliding_log,
    sliding_window,
    token_bucket,
)
from .base import NEVER_US, Outcome, Step

__all__ = ["ALGORITHMS", "NEVER_US", "Algorithm", "Outcome", "Step", "decide", "run"]

Algorithm = Callable[[Any, int, int, int, int, int], Outcome]
"""``(state, now_us, amount, period_us, capacity, cost) -> Step``; for the window
algorithms the capacity equals the amount."""

ALGORITHMS: dict[AlgorithmName, Algorithm] = {
    "fixed_window": fixed_window.decide,
    "sliding_log": sliding_log.decide,
    "sliding_window": sliding_window.decide,
    "token_bucket": token_bucket.decide,
    "gcra": gcra.decide,
    "concurrency": concurrency.decide,
    "calendar_month": calendar_month.decide,
}


def decide(state: Any, now: int, limit: Limit, cost: int) -> Step:
    """Run ``limit``'s algorithm on ``state`` at ``now`` (microseconds)."""
    return Step(*run(limit, state, now, cost))


def run(limit: Limit, state: Any, now: int, cost: int) -> Outcome:
    """``limit``'s algorithm on ``state`` at ``now``, as a plain tuple (the per-request
    form of ``decide``). Named calls rather than ``limit.step``: compiled, they pass the
    numbers and the answer without boxing them or building a tuple."""
    kind = limit.algorithm
    amount, period, capacity = limit.amount, limit.period_us, limit.capacity
    if kind == "sliding_window":
        return sliding_window.decide(state, now, amount, period, capacity, cost)
    if kind == "token_bucket":
        return token_bucket.decide(state, now, amount, period, capacity, cost)
    if kind == "fixed_window":
        return fixed_window.decide(state, now, amount, period, capacity, cost)
    if kind == "concurrency":
        return concurrency.decide(state, now, amount, period, capacity, cost)
    if kind == "gcra":
        return gcra.decide(state, now, amount, period, capacity, cost)
    if kind == "sliding_log":
        return sliding_log.decide(state, now, amount, period, capacity, cost)
    return calendar_month.decide(state, now, amount, period, capacity, cost)

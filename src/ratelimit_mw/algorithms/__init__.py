"""The five algorithms, each a pure function of (state, now, limit, cost) -> Step.

No I/O and no clock reads: storages read the clock (or Redis's) and keep the state.
Each module has a Lua twin of the same stem in ``ratelimit_mw/storage/lua``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..limit import AlgorithmName, Limit
from . import fixed_window, gcra, sliding_log, sliding_window, token_bucket
from .base import NEVER_US, Step

__all__ = ["ALGORITHMS", "NEVER_US", "Algorithm", "Step", "decide"]

Algorithm = Callable[[Any, int, Limit, int], Step]
"""``(state, now_us, limit, cost) -> Step``."""


def _fixed_window(state: Any, now: int, limit: Limit, cost: int) -> Step:
    return fixed_window.decide(state, now, limit.rate.amount, limit.rate.period_us, cost)


def _sliding_log(state: Any, now: int, limit: Limit, cost: int) -> Step:
    return sliding_log.decide(state, now, limit.rate.amount, limit.rate.period_us, cost)


def _sliding_window(state: Any, now: int, limit: Limit, cost: int) -> Step:
    return sliding_window.decide(state, now, limit.rate.amount, limit.rate.period_us, cost)


def _token_bucket(state: Any, now: int, limit: Limit, cost: int) -> Step:
    rate = limit.rate
    return token_bucket.decide(state, now, rate.amount, rate.period_us, limit.capacity, cost)


def _gcra(state: Any, now: int, limit: Limit, cost: int) -> Step:
    rate = limit.rate
    return gcra.decide(state, now, rate.amount, rate.period_us, limit.capacity, cost)


ALGORITHMS: dict[AlgorithmName, Algorithm] = {
    "fixed_window": _fixed_window,
    "sliding_log": _sliding_log,
    "sliding_window": _sliding_window,
    "token_bucket": _token_bucket,
    "gcra": _gcra,
}


def decide(state: Any, now: int, limit: Limit, cost: int) -> Step:
    """Run ``limit``'s algorithm on ``state`` at ``now`` (microseconds)."""
    return ALGORITHMS[limit.algorithm](state, now, limit, cost)

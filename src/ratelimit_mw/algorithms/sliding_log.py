"""Sliding log: the timestamp of every admitted unit within the last period.

State: a sorted tuple of timestamps (one per unit of cost). Exact, memory O(limit).
A unit admitted at ``t`` counts until ``t + period`` (exclusive).
"""

from __future__ import annotations

from bisect import bisect_right

from .base import NEVER_US, Step

State = tuple[int, ...]


def decide(state: State | None, now: int, limit: int, period: int, cost: int) -> Step:
    """Admit ``cost`` units if fewer than ``limit - cost`` are logged in the last period."""
    log = state or ()
    live = log[bisect_right(log, now - period):]
    count = len(live)
    reset = live[-1] + period - now if live else 0
    if cost > limit:
        return Step(False, limit - count, reset, NEVER_US, live)
    if count + cost > limit:
        # The request fits once the oldest (count + cost - limit) units have expired.
        return Step(False, limit - count, reset, live[count + cost - limit - 1] + period - now, live)
    if not cost:
        return Step(True, limit - count, reset, 0, live)
    return Step(True, limit - count - cost, period, 0, live + (now,) * cost)

"""Sliding log: the timestamp of every admitted unit within the last period.

State: a sorted tuple of timestamps (one per unit of cost). Exact, memory O(limit).
A unit admitted at ``t`` counts until ``t + period`` (exclusive).
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right

from .base import NEVER_US, RawStep

SlidingLogState = tuple[int, ...]


def decide(
    state: SlidingLogState | None, now: int, limit: int, period: int, capacity: int, cost: int,
) -> RawStep:
    """Admit ``cost`` units if fewer than ``limit - cost`` are logged in the last period."""
    log = state or ()
    expired = bisect_right(log, now - period)
    live = log[expired:] if expired else log
    count = len(live)
    reset = live[-1] + period - now if live else 0
    if cost > limit:
        return (False, limit - count, reset, NEVER_US, live)
    if count + cost > limit:
        # The request fits once the oldest (count + cost - limit) units have expired.
        oldest_to_go = live[count + cost - limit - 1]
        return (False, limit - count, reset, oldest_to_go + period - now, live)
    if not cost:
        return (True, limit - count, reset, 0, live)
    if live and live[-1] > now:
        # The clock stepped back: the new units go before later ones (the log stays
        # sorted, as Redis's sorted set does), and the latest still sets the reset.
        at = bisect_right(live, now)
        return (True, limit - count - cost, reset, 0, live[:at] + (now,) * cost + live[at:])
    return (True, limit - count - cost, period, 0, live + (now,) * cost)


def settle(state: SlidingLogState | None, now: int, at: int, period: int,
           delta: int) -> SlidingLogState | None:
    """The log with ``delta`` more units stamped ``at`` (or, negative, that many of the
    units stamped ``at`` taken out): as if ``at``'s request had cost that much more.
    Units of ``at`` that have expired by ``now`` are not written back."""
    log = state or ()
    if at <= now - period:
        return state
    if delta > 0:
        place = bisect_right(log, at)
        return log[:place] + (at,) * delta + log[place:]
    first, last = bisect_left(log, at), bisect_right(log, at)
    taken = min(-delta, last - first)
    return log[:last - taken] + log[last:] if taken else state

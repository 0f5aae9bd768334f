"""Sliding-window counter: this window's count plus the previous one's, weighted.

State: ``(window_start_us, current, previous)``. The previous window counts in
proportion to how much of it still overlaps the sliding period. O(1), close to
exact; the usual default for APIs.

The weighted sum is computed in floating point, in the same order of operations
as the Lua twin, so both give bit-identical answers.
"""

from __future__ import annotations

import math

from .base import NEVER_US, RawStep

SlidingWindowState = tuple[int, int, int]


def _counts(state: SlidingWindowState | None, start: int, period: int) -> tuple[int, int]:
    """The (current, previous) counts as seen from the window starting at ``start``."""
    if state is None:
        return 0, 0
    if state[0] == start:
        return state[1], state[2]
    if state[0] == start - period:
        return 0, state[1]
    return 0, 0


def _used(current: int, previous: int, elapsed: int, period: int) -> float:
    """Weighted usage ``elapsed`` microseconds into the current window."""
    return previous * ((period - elapsed) / period) + current


def _admits(state: SlidingWindowState | None, t: int, limit: int, period: int, cost: int) -> bool:
    start = t - t % period
    current, previous = _counts(state, start, period)
    return _used(current, previous, t - start, period) + cost <= limit


def _retry_at(
    state: SlidingWindowState | None, now: int, limit: int, period: int, cost: int,
) -> int:
    """The first microsecond at which ``cost`` units fit, nothing else happening."""
    start = now - now % period
    current, previous = _counts(state, start, period)
    if current + cost <= limit:
        # Later in this window: wait for the previous window's weight to fall.
        t = start + math.ceil(period - (limit - current - cost) / previous * period)
    else:
        # This window's count becomes the previous one's; wait for its weight to fall.
        t = start + period + math.ceil(period - (limit - cost) / current * period)
    # The guess comes from float division: mostly right, or a microsecond off; but with
    # a large limit the weighted sum stays flat for long stretches (changes below half
    # a float step are lost), so it can be far off. Admission only grows with time
    # (the weighted count only falls), so the first admitted microsecond is found by
    # bisection between the guess and a bound: the end of the next window, when the
    # count is 0. At most ~50 steps, whatever the limit.
    t = min(max(t, now + 1), start + 2 * period)
    if _admits(state, t, limit, period, cost):
        if t - 1 == now or not _admits(state, t - 1, limit, period, cost):
            return t
        low, high = now, t - 1
    else:
        low, high = t, start + 2 * period
    while high - low > 1:
        middle = (low + high) // 2
        if _admits(state, middle, limit, period, cost):
            high = middle
        else:
            low = middle
    return high


def decide(
    state: SlidingWindowState | None, now: int, limit: int, period: int, capacity: int, cost: int,
) -> RawStep:
    """Admit ``cost`` units if the weighted count of the sliding period has room."""
    start = now - now % period
    # _counts and _used, written out: this runs per request.
    if state is None:
        current = previous = 0
    elif state[0] == start:
        current, previous = state[1], state[2]
    elif state[0] == start - period:
        current, previous = 0, state[1]
    else:
        current = previous = 0
    used = previous * ((period - (now - start)) / period) + current
    if current:
        reset = start + 2 * period - now
    elif previous:
        reset = start + period - now
    else:
        reset = 0
    seen = (start, current, previous) if current or previous else None
    if cost > limit:
        return (False, math.floor(limit - used), reset, NEVER_US, seen)
    if used + cost > limit:
        retry = _retry_at(state, now, limit, period, cost) - now
        return (False, math.floor(limit - used), reset, retry, seen)
    if not cost:
        return (True, math.floor(limit - used), reset, 0, seen)
    return (True, math.floor(limit - used - cost), start + 2 * period - now, 0,
                (start, current + cost, previous))


def settle(state: SlidingWindowState | None, now: int, at: int, period: int,
           delta: int) -> SlidingWindowState | None:
    """The state with ``delta`` more units (fewer, when negative) charged at ``at``: in
    the count of ``at``'s window, whether it is still the current one or the previous
    one by ``now``; older, it no longer counts."""
    start = at - at % period
    if state is None:  # nothing reserved (an estimate of 0): a count of its own
        if delta <= 0 or now >= start + 2 * period:
            return None
        if now < start + period:
            return (start, delta, 0)
        return (start + period, 0, delta)
    if state[0] == start:
        return (start, max(0, state[1] + delta), state[2])
    if state[0] == start + period:
        return (state[0], state[1], max(0, state[2] + delta))
    return state

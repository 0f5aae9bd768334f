"""Fixed window: one counter per window aligned to the epoch.

State: ``(window_start_us, count)``. Cheap, but allows up to twice the limit
across a window edge.
"""

from __future__ import annotations

from .base import NEVER_US, RawStep

FixedWindowState = tuple[int, int]


def decide(
    state: FixedWindowState | None, now: int, limit: int, period: int, capacity: int, cost: int,
) -> RawStep:
    """Admit ``cost`` units at ``now`` if the current window has room."""
    start = now - now % period
    return in_window(state, now, start, start + period, limit, cost)


def in_window(
    state: FixedWindowState | None, now: int, start: int, end: int, limit: int, cost: int,
) -> RawStep:
    """Admit ``cost`` units if the window ``[start, end)`` holding ``now`` has room."""
    count = state[1] if state is not None and state[0] == start else 0
    if cost > limit:
        return (False, limit - count, end - now if count else 0, NEVER_US, state)
    if count + cost > limit:
        return (False, limit - count, end - now, end - now, state)
    used = count + cost
    new_state = (start, used) if cost else state
    return (True, limit - used, end - now if used else 0, 0, new_state)


def settle(state: FixedWindowState | None, now: int, at: int, period: int,
           delta: int) -> FixedWindowState | None:
    """The state with ``delta`` more units (fewer, when negative) charged at ``at``, in
    ``at``'s window; a window that has ended by ``now`` keeps nothing to settle."""
    start = at - at % period
    return settle_in(state, now, start, start + period, delta)


def settle_in(state: FixedWindowState | None, now: int, start: int, end: int,
              delta: int) -> FixedWindowState | None:
    """``settle`` in the window ``[start, end)``. The count may pass the limit (debt):
    nothing more is admitted until the window ends."""
    if state is not None and state[0] == start:
        return (start, max(0, state[1] + delta))
    if state is None and now < end and delta > 0:  # nothing reserved (an estimate of 0)
        return (start, delta)
    return state

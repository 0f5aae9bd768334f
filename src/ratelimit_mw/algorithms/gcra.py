"""Leaky bucket as GCRA (the generic cell rate algorithm of redis-cell and throttled).

State: the theoretical arrival time (TAT) in microseconds. Each unit advances it by
the emission interval ``T = period / amount`` (rounded up, so the pace never exceeds
the rate); up to ``capacity`` units may arrive at once (tolerance ``tau = T * capacity``).
"""

from __future__ import annotations

from .base import NEVER_US, Outcome, ceil_div

State = int


def decide(
    state: State | None, now: int, amount: int, period: int, capacity: int, cost: int,
) -> Outcome:
    """Admit ``cost`` units unless that pushes the TAT beyond ``now + tau``."""
    interval = ceil_div(period, amount)
    tau = interval * capacity
    tat = max(state, now) if state is not None else now
    seen = tat if tat > now else None
    remaining = (now + tau - tat) // interval
    if cost > capacity:
        return (False, remaining, tat - now, NEVER_US, seen)
    new_tat = tat + cost * interval
    allow_at = new_tat - tau
    if now < allow_at:
        return (False, remaining, tat - now, allow_at - now, seen)
    if not cost:
        return (True, remaining, tat - now, 0, seen)
    return (True, (now - allow_at) // interval, new_tat - now, 0, new_tat)

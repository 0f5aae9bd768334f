"""Leaky bucket as GCRA (the generic cell rate algorithm of redis-cell and throttled).

State: the theoretical arrival time (TAT) as ``(us, ticks)``, microseconds and a
fraction of the next one (in Redis ``"us.ticks"``, which a version before ticks reads
as microseconds, less than one off). Each unit advances it by the emission interval
``T = period / amount``; up to ``capacity`` units may arrive at once (the tolerance
``tau = T * capacity``). ``T`` is seldom a whole number of microseconds (300 000 a
second is 3⅓ µs), so time is counted in ticks, ``1 / per_us`` of a microsecond, in
which ``T`` is whole: the pace is the rate's, not a rounded one.
"""

from __future__ import annotations

import math
from typing import Final

from .base import NEVER_US, RawStep, ceil_div

GcraState = tuple[int, int]

EXACT: Final = 2**52
"""The most ticks a tolerance may span. Redis's Lua counts in doubles, exact below
2**53; every sum below stays under twice this."""


def ticks(amount: int, period: int, capacity: int) -> tuple[int, int]:
    """``(per_us, interval)``: ticks in a microsecond and ticks in ``T``.

    Exact (``T = period / amount`` to the tick) unless the tolerance would span more
    than ``EXACT`` ticks; then ticks are the finest that fit, and ``T`` is rounded up
    to a whole tick, at most 0.03 % slower than the rate (a rate of 10 000 019 a day,
    say). The fallback counts in floats the way the Lua twin does.
    """
    common = math.gcd(period, amount)
    per_us, interval = amount // common, period // common
    if interval * capacity <= EXACT:
        return per_us, interval
    # A budget short of EXACT by twice the capacity: rounding the interval up adds at
    # most a tick per unit of the tolerance, and the float division a little more.
    per_us = math.floor((EXACT - 2 * capacity) / max(float(period) * capacity / amount,
                                                     float(period)))
    return per_us, ceil_div(period * per_us, amount)


def decide(
    state: GcraState | None, now: int, amount: int, period: int, capacity: int, cost: int,
    delay: int = 0,
) -> RawStep:
    """Admit ``cost`` units unless that pushes the TAT beyond ``now + tau``.

    With ``delay`` (microseconds: a shaped limit's most a request may wait), a request
    that fits within ``delay`` from now is admitted with its start that far ahead: the
    step's ``retry_us`` of an admitted request is how long it waits for its turn, which
    it has taken (the leaky bucket as a queue, nginx's ``limit_req`` without
    ``nodelay``). Beyond ``delay``, it is refused, ``retry_us`` saying when it would
    fit within it."""
    per_us, interval = ticks(amount, period, capacity + (
        ceil_div(delay * amount, period) if delay else 0))
    tau = interval * capacity
    # ahead: how far the TAT is past now, in ticks.
    ahead = (state[0] - now) * per_us + state[1] if state is not None and state[0] >= now else 0
    seen = state if ahead > 0 else None
    remaining = (tau - ahead) // interval
    reset = ceil_div(ahead, per_us)
    if cost > capacity:
        return (False, remaining, reset, NEVER_US, seen)
    new_ahead = ahead + cost * interval
    late = new_ahead - tau
    wait = 0
    if late > 0:
        wait = ceil_div(late, per_us)
        if wait > delay:
            return (False, remaining, reset, wait - delay, seen)
    if not cost:
        return (True, remaining, reset, 0, seen)
    return (True, -late // interval if late <= 0 else 0, ceil_div(new_ahead, per_us), wait,
            (now + new_ahead // per_us, new_ahead % per_us))


def settle(state: GcraState | None, now: int, amount: int, period: int, capacity: int,
           delta: int) -> GcraState | None:
    """The TAT moved by ``delta`` emission intervals (back, when negative), as if the
    reserved request had cost ``delta`` more: exact unless the bucket drained to empty
    between the reservation and this settlement and a request came meanwhile. A TAT
    beyond the tolerance is debt: nothing is admitted until it is within it again."""
    per_us, interval = ticks(amount, period, capacity)
    if state is None:  # an empty bucket: only a debt changes it, from now
        if delta <= 0:
            return None
        total = now * per_us + delta * interval
    else:
        total = state[0] * per_us + state[1] + delta * interval
    if total <= now * per_us:
        return None
    return (total // per_us, total % per_us)

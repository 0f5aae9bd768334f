"""Token bucket: ``capacity`` tokens (the burst), refilled at ``amount`` per ``period``.

State: ``(tokens, last_us)``; tokens is a float, refilled lazily at each decision in
the same order of operations as the Lua twin, so both give bit-identical answers.
"""

from __future__ import annotations

import math

from .base import NEVER_US, Step

State = tuple[float, int]


def _available(state: State | None, t: int, capacity: int, rate: float) -> float:
    """Tokens in the bucket at ``t`` (a missing bucket is full)."""
    if state is None:
        return float(capacity)
    tokens, last = state
    return min(float(capacity), tokens + max(0, t - last) * rate)


def _first(
    state: State | None, low: int, t: int, want: float, capacity: int, rate: float,
) -> int:
    """The first microsecond from ``low`` on at which the bucket holds ``want`` tokens.

    ``t`` is a guess from float division, which may be a microsecond off either way.
    """
    t = max(t, low)
    while t > low and _available(state, t - 1, capacity, rate) >= want:
        t -= 1
    while _available(state, t, capacity, rate) < want:
        t += 1
    return t


def decide(
    state: State | None, now: int, amount: int, period: int, capacity: int, cost: int,
) -> Step:
    """Take ``cost`` tokens if the bucket holds that many."""
    rate = amount / period
    tokens = _available(state, now, capacity, rate)
    reset = _first(state, now, now + math.ceil((capacity - tokens) / rate), capacity, capacity,
                   rate) - now
    if cost > capacity:
        return Step(False, math.floor(tokens), reset, NEVER_US, state)
    if tokens < cost:
        retry = _first(state, now + 1, now + math.ceil((cost - tokens) / rate), cost, capacity, rate) - now
        return Step(False, math.floor(tokens), reset, retry, state)
    if not cost:
        return Step(True, math.floor(tokens), reset, 0, state)
    left = tokens - cost
    new_state = (left, now)
    reset = _first(new_state, now, now + math.ceil((capacity - left) / rate), capacity, capacity,
                   rate) - now
    return Step(True, math.floor(left), reset, 0, new_state)

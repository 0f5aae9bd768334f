"""Token bucket: ``capacity`` tokens (the burst), refilled at ``amount`` per ``period``.

State: ``(tokens, last_us)``; tokens is a float, refilled lazily at each decision in
the same order of operations as the Lua twin, so both give bit-identical answers.
The bucket counts as full from ``last + ceil((capacity - tokens) / rate)`` on, so
that "full again" is an exact microsecond, immune to float rounding.
"""

from __future__ import annotations

import math

from .base import NEVER_US, RawStep

TokenBucketState = tuple[float, int]


def _available(state: TokenBucketState | None, t: int, capacity: int, rate: float) -> float:
    """Tokens in the bucket at ``t`` (a missing bucket is full)."""
    if state is None:
        return float(capacity)
    tokens, last = state
    if t - last >= math.ceil((capacity - tokens) / rate):
        return float(capacity)
    return min(float(capacity), tokens + max(0, t - last) * rate)


def _first(
    state: TokenBucketState | None, low: int, t: int, want: float, capacity: int, rate: float,
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
    state: TokenBucketState | None, now: int, amount: int, period: int, capacity: int, cost: int,
) -> RawStep:
    """Take ``cost`` tokens if the bucket holds that many."""
    rate = amount / period
    if state is None:
        tokens, reset = float(capacity), 0
    else:
        tokens = _available(state, now, capacity, rate)
        full_at = state[1] + math.ceil((capacity - state[0]) / rate)
        reset = full_at - now if full_at > now else 0
    if cost > capacity:
        return (False, math.floor(tokens), reset, NEVER_US, state)
    if tokens < cost:
        # Refilling starts at the last refill, which after the clock stepped back is
        # still ahead: guessed from there, the walk is a step or two, not one per
        # microsecond of the step back (seconds of it blocked the loop, and Redis).
        start = state[1] if state is not None and state[1] > now else now
        guess = start + math.ceil((cost - tokens) / rate)
        retry = _first(state, now + 1, guess, cost, capacity, rate) - now
        return (False, math.floor(tokens), reset, retry, state)
    if not cost:
        return (True, math.floor(tokens), reset, 0, state)
    left = tokens - cost
    return (True, math.floor(left), math.ceil((capacity - left) / rate), 0, (left, now))


def settle(state: TokenBucketState | None, now: int, capacity: int,
           delta: int) -> TokenBucketState | None:
    """The bucket with ``delta`` more tokens taken (given back, when negative), at its
    last refill: exact unless it refilled to full between the reservation and this
    settlement and a request came meanwhile (the cap already dropped the difference).
    Tokens may go below 0 (debt): nothing is admitted until they have refilled."""
    if state is None:  # a full bucket: only a debt changes it, from now
        return (float(capacity - delta), now) if delta > 0 else None
    tokens, last = state
    return (min(float(capacity), tokens - delta), last)

"""Concurrency: at most ``capacity`` requests in flight, each holding a leased slot.

State: a tuple of ``(expires_us, lease_id)`` sorted by expiry. A slot is given back
when its request ends (the storage removes the lease) or, if its worker died, when
its lease expires. The decision leaves the new lease to the storage, which names it.
"""

from __future__ import annotations

from typing import Final

from .base import NEVER_US, RawStep

ConcurrencyState = tuple[tuple[int, str], ...]

RETRY_HINT_US: Final = 1_000_000
"""A slot may free up at any moment; a denied request is told to retry within 1 s
(or when the oldest lease expires, if sooner)."""


def decide(
    state: ConcurrencyState | None, now: int, amount: int, period: int, capacity: int, cost: int,
) -> RawStep:
    """Admit ``cost`` (1, or 0 to look) requests if that many slots are free."""
    if not state:
        live: ConcurrencyState = ()
    elif state[0][0] > now:  # sorted by expiry: the oldest alive, all alive
        live = state
    else:
        live = tuple(lease for lease in state if lease[0] > now)
    in_flight = len(live)
    reset = live[-1][0] - now if live else 0
    if cost > capacity:
        return (False, capacity - in_flight, reset, NEVER_US, live)
    if in_flight + cost > capacity:
        return (False, capacity - in_flight, reset, min(live[0][0] - now, RETRY_HINT_US), live)
    if not cost:
        return (True, capacity - in_flight, reset, 0, live)
    return (True, capacity - in_flight - cost, max(reset, period), 0, live)


def with_lease(live: ConcurrencyState, now: int, period: int, lease_id: str) -> ConcurrencyState:
    """The state after an admitted request took the slot named ``lease_id``."""
    lease = (now + period, lease_id)
    if not live or live[-1][0] <= lease[0]:
        return live + (lease,)  # noqa: RUF005 (see docs/internals.md, compiled build)
    return tuple(sorted((*live, lease)))  # the clock went back: keep the order


def renewed(state: ConcurrencyState, now: int, period: int, lease_id: str) -> ConcurrencyState:
    """The state after the request holding ``lease_id`` renewed its slot to a whole
    ``period`` from ``now``; a lease that has ended (or was given back) stays ended."""
    for i, (expires, held) in enumerate(state):
        if held == lease_id:
            if expires <= now:
                return state
            return with_lease(state[:i] + state[i + 1:], now, period, lease_id)
    return state


def without_lease(state: ConcurrencyState, lease_id: str) -> ConcurrencyState:
    """The state after the request holding ``lease_id`` gave its slot back."""
    for i, lease in enumerate(state):
        if lease[1] == lease_id:
            return state[:i] + state[i + 1:]
    return state

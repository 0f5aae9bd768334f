"""What a storage answers: one decision per limit, and the verdict for the request."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Final, NamedTuple

from .hits import Hit
from .limits import Limit

__all__ = ["NEVER", "Adjustment", "Decision", "Hold", "Lease", "Verdict", "binding_of",
           "decision_from", "new_lease", "new_verdict"]

NEVER: Final = math.inf
"""``retry_after`` of a request whose cost is larger than the limit can ever admit."""


class Decision(NamedTuple):
    """One limit's answer for one request.

    ``reset_after``: seconds until the quota is fully back. ``retry_after``: seconds
    until this same request would be admitted (0 when allowed, ``NEVER`` when it
    cannot ever be). Waiting exactly ``retry_after`` and trying again is admitted,
    absent other traffic.
    """

    allowed: bool
    quota: int
    remaining: int
    reset_after: float
    retry_after: float
    limit: Limit
    scope: str = ""

    @property
    def never(self) -> bool:
        """True when no amount of waiting admits this request."""
        return self.retry_after == NEVER

    def __str__(self) -> str:
        verb = "allowed" if self.allowed else "denied"
        return (f"{verb} by {self.limit}: {self.remaining}/{self.quota} left, "
                f"reset in {self.reset_after:g}s, retry in {self.retry_after:g}s")


class Lease(NamedTuple):
    """A concurrency slot held by an admitted request; give it back with ``release``."""

    key: str
    scope: str
    uid: str
    id: str


class Adjustment(NamedTuple):
    """A reserved charge settled after its response: ``delta`` more units (fewer, when
    negative) on ``hit``'s counter for the caller ``key``, whose request was decided at
    ``at`` (epoch seconds on the storage's clock)."""

    key: str
    hit: Hit
    delta: int
    at: float


Hold = Lease | Adjustment
"""What closing a decision's holds asks of the storage (``Storage.close_holds``): give a
concurrency slot back (its ``Lease``), or settle a reserved charge (an ``Adjustment``,
which also gives back a shaped request's turn: docs/internals.md, "Holds")."""


class Verdict(NamedTuple):
    """All the limits of one request, decided together: admitted only if all admit.

    ``leases`` holds the concurrency slots the request took (empty when denied);
    ``at`` is the storage's clock (epoch seconds) when it decided: with Redis, the
    Redis server's, so that epoch times built on it agree across app servers.
    """

    allowed: bool
    decisions: tuple[Decision, ...]
    leases: tuple[Lease, ...] = ()
    at: float | None = None

    @property
    def retry_after(self) -> float:
        """Seconds until the request as a whole would be admitted (0 when allowed)."""
        if self.allowed:
            return 0.0
        return max((d.retry_after for d in self.decisions if not d.allowed), default=0.0)

    @property
    def binding(self) -> Decision | None:
        """The decision to report (in single-policy headers, the 429 body, the log):
        see ``binding_of``."""
        return binding_of(self.decisions, self.allowed) if self.decisions else None


def binding_of(decisions: Sequence[Decision], allowed: bool) -> Decision:
    """The decision to report among ``decisions`` (at least one).

    Denied: the longest wait, then the fewest remaining. Admitted: the rate limit
    nearest exhaustion (free concurrency slots are not a quota to pace against, so a
    slot is reported only when the request has no rate limit), then the soonest reset.
    """
    if len(decisions) == 1:
        return decisions[0]
    best: Decision | None = None
    if not allowed:
        for d in decisions:
            if not d.allowed and (best is None or d.retry_after > best.retry_after or (
                    d.retry_after == best.retry_after and d.remaining < best.remaining)):
                best = d
        return best if best is not None else decisions[0]
    best = decisions[0]
    for d in decisions:  # the first against itself changes nothing
        slot, best_slot = d.limit.is_concurrency, best.limit.is_concurrency
        if (slot != best_slot and best_slot) or (slot == best_slot and (
                d.remaining < best.remaining or (
                    d.remaining == best.remaining and d.reset_after < best.reset_after))):
            best = d
    return best


# tuple.__new__ skips a named tuple's interpreted __new__; these run per request. Final
# names are C statics when compiled, where the classes would be looked up per call.
_new: Final = tuple.__new__
_DECISION: Final = Decision
_VERDICT: Final = Verdict
_LEASE: Final = Lease


def new_verdict(allowed: bool, decisions: tuple[Decision, ...], leases: tuple[Lease, ...],
                at: float | None) -> Verdict:
    """``Verdict(allowed, decisions, leases, at)``, made as cheaply as a tuple is."""
    verdict: Verdict = _new(_VERDICT, (allowed, decisions, leases, at))
    return verdict


def new_lease(key: str, scope: str, uid: str, lease_id: str) -> Lease:
    """``Lease(key, scope, uid, lease_id)``, made as cheaply as a tuple is."""
    lease: Lease = _new(_LEASE, (key, scope, uid, lease_id))
    return lease


def decision_from(
    hit: Hit, allowed: bool, remaining: int, reset_us: int, retry_us: int,
) -> Decision:
    """Build a public decision from an algorithm step in microseconds (-1 retry: never)."""
    limit = hit.limit
    return _new(_DECISION, (
        allowed,
        limit.capacity,
        remaining if remaining > 0 else 0,
        reset_us / 1_000_000,
        retry_us / 1_000_000 if retry_us >= 0 else NEVER,
        limit,
        hit.scope,
    ))

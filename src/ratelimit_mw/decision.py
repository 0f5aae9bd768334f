"""What a storage answers: one decision per limit, and the verdict for the request."""

from __future__ import annotations

import math
from typing import NamedTuple

from .policy import Hit, Limit

__all__ = ["NEVER", "Decision", "Lease", "Verdict", "decision_from"]

NEVER = math.inf
"""``retry_after`` of a request whose cost is larger than the limit can ever admit."""


class Decision(NamedTuple):
    """One limit's answer for one request.

    ``reset_after``: seconds until the quota is fully back. ``retry_after``: seconds
    until this same request would be admitted (0 when allowed, ``NEVER`` when it
    cannot ever be). Waiting exactly ``retry_after`` and trying again is admitted,
    absent other traffic.
    """

    allowed: bool
    limit: int
    remaining: int
    reset_after: float
    retry_after: float
    policy: Limit
    scope: str = ""

    @property
    def never(self) -> bool:
        """True when no amount of waiting admits this request."""
        return self.retry_after == NEVER

    def __str__(self) -> str:
        verb = "allowed" if self.allowed else "denied"
        return (f"{verb} by {self.policy}: {self.remaining}/{self.limit} left, "
                f"reset in {self.reset_after:g}s, retry in {self.retry_after:g}s")


class Lease(NamedTuple):
    """A concurrency slot held by an admitted request; give it back with ``release``."""

    key: str
    scope: str
    uid: str
    id: str


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
        """The decision to report: the longest denial, else the one nearest exhaustion."""
        decisions = self.decisions
        if not decisions:
            return None
        if len(decisions) == 1:
            return decisions[0]
        if not self.allowed:
            denied = [d for d in decisions if not d.allowed]
            return max(denied, key=lambda d: (d.retry_after, -d.remaining))
        return min(decisions, key=lambda d: (d.remaining, d.reset_after))


_new = tuple.__new__


def decision_from(
    hit: Hit, allowed: bool, remaining: int, reset_us: int, retry_us: int,
) -> Decision:
    """Build a public decision from an algorithm step in microseconds (-1 retry: never)."""
    limit = hit.limit
    # tuple.__new__ skips the named tuple's Python-level __new__: this runs per request.
    return _new(Decision, (
        allowed,
        limit.capacity,
        remaining if remaining > 0 else 0,
        reset_us / 1_000_000,
        retry_us / 1_000_000 if retry_us >= 0 else NEVER,
        limit,
        hit.scope,
    ))

"""Keys known to be over their limit, answered without asking the shared storage again.

While a key's denial lasts, its next requests get the same 429 from this worker's
memory (as Envoy caches keys over the limit): a client hammering away costs a dict
look-up, not a round trip. Only the shared storage's denials are kept, and never one
a concurrency slot made (a slot may free any moment).
"""

from __future__ import annotations

import math
from typing import NamedTuple

from .decision import Decision, Verdict
from .limit_sets import LimitSet
from .outcome import Outcome

__all__ = ["Blocked", "BlockedKeys"]


class Blocked(NamedTuple):
    """A key over its limit until ``until``, with the outcome last made for it (and the
    Retry-After it was made for). Never changed: a new outcome makes a new entry."""

    verdict: Verdict
    at: float
    until: float
    wait: int = -1
    outcome: Outcome | None = None

    def verdict_at(self, now: float) -> Verdict:
        """The kept verdict with its times moved on to ``now``."""
        gone = now - self.at
        at = self.verdict.at
        return Verdict(False, tuple(
            Decision(d.allowed, d.quota, d.remaining, max(0.0, d.reset_after - gone),
                     max(0.0, d.retry_after - gone), d.limit, d.scope)
            for d in self.verdict.decisions), (), None if at is None else at + gone)


class BlockedKeys:
    """At most ``size`` keys over their limit, the oldest forgotten first."""

    __slots__ = ("_keys", "size")

    def __init__(self, size: int) -> None:
        self.size = size
        self._keys: dict[tuple[str, LimitSet], Blocked] = {}

    def __len__(self) -> int:
        """How many denials are kept."""
        return len(self._keys)

    def get(self, key: str, limit_set: LimitSet, now: float) -> Blocked | None:
        """The entry of ``key`` on ``limit_set`` if its denial still lasts at ``now``."""
        blocked = self._keys.get((key, limit_set))
        if blocked is None:
            return None
        if now < blocked.until:
            return blocked
        del self._keys[(key, limit_set)]
        return None

    def forget(self, key: str) -> None:
        """Drop every kept denial of ``key`` (its counters were reset)."""
        for kept in [kept for kept in self._keys if kept[0] == key]:
            del self._keys[kept]

    def keep(self, key: str, limit_set: LimitSet, verdict: Verdict, now: float) -> None:
        """Remember a denial the shared storage made (``now``: when it answered, so
        that a Retry-After never points earlier than the real wait)."""
        if not math.isfinite(verdict.retry_after) or _slot_denied(verdict):
            return
        keys = self._keys
        if len(keys) >= self.size:
            del keys[next(iter(keys))]
        keys[(key, limit_set)] = Blocked(verdict, now, now + verdict.retry_after)

    def made(self, key: str, limit_set: LimitSet, blocked: Blocked, outcome: Outcome,
             wait: int) -> None:
        """``outcome`` answers ``key``'s requests while their Retry-After is ``wait``."""
        if self._keys.get((key, limit_set)) is blocked:
            self._keys[(key, limit_set)] = blocked._replace(outcome=outcome, wait=wait)


def _slot_denied(verdict: Verdict) -> bool:
    """True when a concurrency slot is among what denied ``verdict``."""
    return any(not d.allowed and d.limit.is_concurrency for d in verdict.decisions)

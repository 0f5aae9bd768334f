"""Hits: one limit applied to one request, with a cost, in a scope; and folding the hits
of one request that fall on the same counter."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from mypy_extensions import mypyc_attr

from .errors import ConfigError
from .limits import Limit

__all__ = ["Hit", "MergedHits", "Slot", "merge_hits", "spends"]

Slot = tuple[str, ...]
"""A counter's place among an identity's: ``(scope, limit uid)``. Typed of any length:
compiled, a fixed-length tuple is kept as its items and made anew at each read, where a
storage should keep (and compare) the one tuple object."""


@mypyc_attr(allow_interpreted_subclasses=True)
@dataclass(frozen=True, slots=True)
class Hit:
    """One limit applied to one request: ``cost`` units, in a ``scope`` (e.g. a route).

    A cost of 0 looks at the limit without consuming anything.
    """

    limit: Limit
    cost: int = 1
    scope: str = ""
    slot: Slot = field(init=False, repr=False, compare=False)

    # Written out, ``cost`` and ``scope`` typed object: see ``checks``.
    def __init__(self, limit: object, cost: object = 1, scope: object = "") -> None:
        if not isinstance(limit, Limit):
            msg = f"Hit needs a Limit, got {limit!r}"
            raise ConfigError(msg)
        if isinstance(cost, bool) or not isinstance(cost, int) or cost < 0:
            msg = f"cost must be a whole number >= 0, got {cost!r}"
            raise ConfigError(msg)
        if cost > 1 and limit.is_concurrency:
            msg = (f"a request holds one slot of a concurrency limit: cost must be 0 or 1, "
                   f"got {cost!r}")
            raise ConfigError(msg)
        if not isinstance(scope, str):
            msg = f"scope must be a string, got {scope!r}"
            raise ConfigError(msg)
        set_ = object.__setattr__
        set_(self, "limit", limit)
        set_(self, "cost", cost)
        set_(self, "scope", scope)
        set_(self, "slot", (scope, limit.uid))

    def __reduce__(self) -> tuple[Any, ...]:
        # Compiled, the class has no instance dict for pickle and copy to fill in.
        return (type(self), (self.limit, self.cost, self.scope))

    @property
    def never(self) -> bool:
        """True when the cost is larger than the limit can ever admit."""
        return self.cost > self.limit.capacity


@mypyc_attr(native_class=False)  # a tuple subclass: mypyc compiles none
class MergedHits(tuple[Hit, ...]):
    """Hits already folded by ``merge_hits``: folding them again is free.

    A limit set folds its hits once, so the storages skip the check per request. Decisions
    come back in the order of the merged hits.
    """

    __slots__ = ()


def spends(hits: Sequence[Hit]) -> list[tuple[str, int]]:
    """What a request's ``hits`` spend of units other than requests (tokens): each unit
    once, at its first hit's cost (a tier's tokens per minute and per day are one
    spending)."""
    spent: list[tuple[str, int]] = []
    for hit in hits:
        unit = hit.limit.unit
        if unit != "requests" and hit.cost and all(unit != seen for seen, _ in spent):
            spent.append((unit, hit.cost))
    return spent


def merge_hits(hits: Sequence[Hit]) -> Sequence[Hit]:
    """Fold hits on the same counter (same limit and scope) into one, costs added (a
    concurrency limit's: one slot, whatever the count).

    Two hits on one counter must consume from one state, not overwrite each other.
    """
    if type(hits) is MergedHits:
        return hits
    count = len(hits)
    if count < 2:
        return hits
    slots = [hit.slot for hit in hits]
    if count <= 8:  # the usual few limits: pairwise checks beat building a dict
        if not any(slots[i] in slots[i + 1:] for i in range(count - 1)):
            return MergedHits(hits)
    elif len(set(slots)) == count:
        return MergedHits(hits)
    merged: dict[Slot, Hit] = {}
    for hit in hits:
        seen = merged.get(hit.slot)
        if seen is None:
            merged[hit.slot] = hit
        elif hit.limit.is_concurrency:  # one request, one slot, however often named
            merged[hit.slot] = Hit(seen.limit, max(seen.cost, hit.cost), hit.scope)
        else:
            merged[hit.slot] = Hit(seen.limit, seen.cost + hit.cost, hit.scope)
    return MergedHits(merged.values())

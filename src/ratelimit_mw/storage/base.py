"""The storage interface: every limit of one request decided in one atomic call."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any

from ..decision import NEVER, Decision, Verdict
from ..limit import Hit

__all__ = ["Storage", "decision_from", "merge_hits"]

_new = tuple.__new__


class Storage(ABC):
    """Decides hits atomically: a request is admitted only when every hit admits it,
    and a denied request consumes nothing from any of them.

    ``key`` is the identity the limits count for (a client IP, an API key, a user);
    every hit of one call is stored under that identity, which on Redis means one
    hash slot, so the same call works on Redis Cluster.
    """

    @abstractmethod
    async def decide(self, key: str, hits: Sequence[Hit]) -> Verdict:
        """Consume every hit's cost if all of them admit the request; else nothing."""

    async def peek(self, key: str, hits: Sequence[Hit]) -> Verdict:
        """Look at the limits without consuming anything (for quota reports)."""
        return await self.decide(key, [Hit(hit.limit, 0, hit.scope) for hit in hits])

    @abstractmethod
    async def reset(self, key: str) -> None:
        """Forget every counter of ``key``."""

    async def ping(self) -> bool:
        """True when the storage answers."""
        return True

    async def close(self) -> None:  # noqa: B027 - optional hook
        """Release connections; the storage is not used afterwards."""

    async def __aenter__(self) -> Storage:
        return self

    async def __aexit__(self, *exc_info: Any) -> None:
        await self.close()


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


def merge_hits(hits: Sequence[Hit]) -> Sequence[Hit]:
    """Fold hits on the same counter (same limit and scope) into one, costs added.

    Two hits on one counter must consume from one state, not overwrite each other.
    """
    if len(hits) < 2:
        return hits
    merged: dict[tuple[str, str], Hit] = {}
    for hit in hits:
        slot = (hit.scope, hit.limit.uid)
        seen = merged.get(slot)
        merged[slot] = hit if seen is None else Hit(seen.limit, seen.cost + hit.cost, hit.scope)
    return hits if len(merged) == len(hits) else list(merged.values())

"""Script calls made one per identity (whose keys share a hash slot, so each call works
on Cluster), a few at a time, each standing on its own."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

from ..errors import StorageError
from .faults import cause

__all__ = ["by_identity", "per_identity"]

T = TypeVar("T")

_AT_ONCE = 16  # calls in flight at once (a burst of new connections would time out)


def by_identity(items: Sequence[T], key: Callable[[T], str]) -> list[list[T]]:
    """``items`` grouped by the identity ``key`` names, in order of first appearance."""
    groups: dict[str, list[T]] = {}
    for item in items:
        groups.setdefault(key(item), []).append(item)
    return list(groups.values())


async def per_identity(groups: list[list[T]], call: Callable[[list[T]], Awaitable[object]],
                       failed_to: str) -> None:
    """``call`` each group, a few at a time; when some fail, a ``StorageError`` says
    how many items of all (``failed_to``: ``"renew {} of {} slot(s)"``)."""
    ways = asyncio.Semaphore(_AT_ONCE)

    async def one(group: list[T]) -> None:
        async with ways:
            await call(group)

    outcomes = await asyncio.gather(*map(one, groups), return_exceptions=True)
    failed = [(group, outcome) for group, outcome in zip(groups, outcomes, strict=True)
              if isinstance(outcome, BaseException)]
    if failed:
        count, total = sum(len(group) for group, _ in failed), sum(map(len, groups))
        msg = f"redis could not {failed_to.format(count, total)}: {cause(failed[0][1])}"
        raise StorageError(msg) from failed[0][1]

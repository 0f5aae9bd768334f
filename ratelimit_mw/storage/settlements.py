"""Settling reserved charges on Redis, after their responses: one call of settle.lua per
identity (a request's adjustments share one, so it settles atomically)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from redis.commands.core import AsyncScript

from ..decision import Adjustment
from ..errors import StorageError
from .faults import cause
from .keys import redis_key

__all__ = ["by_identity", "settle_adjustments", "settle_call"]

_SETTLING = 16  # settlements (script calls, one per identity) in flight at once


def by_identity(adjustments: Sequence[Adjustment]) -> list[list[Adjustment]]:
    """``adjustments`` grouped by the caller whose counters they move."""
    groups: dict[str, list[Adjustment]] = {}
    for adjustment in adjustments:
        groups.setdefault(adjustment.key, []).append(adjustment)
    return list(groups.values())


def settle_call(prefix: str, clock: str,
                group: Sequence[Adjustment]) -> tuple[list[str], list[str]]:
    """The keys and arguments of settle.lua for one identity's ``group``: the clock,
    then per adjustment its limit, delta, decision time (microseconds) and the unit
    whose usage history it moves (each request's unit once: a tier's tokens per
    minute and per day are one spending)."""
    keys = []
    args = [clock]
    counted: set[tuple[str, float]] = set()
    for key, hit, delta, at in group:
        limit = hit.limit
        unit = limit.unit
        if unit == "requests" or (unit, at) in counted:
            unit = ""
        else:
            counted.add((unit, at))
        keys.append(redis_key(prefix, key, hit.scope, limit.uid))
        args += (limit.algorithm, str(limit.amount), str(limit.period_us),
                 str(limit.capacity), str(delta), str(round(at * 1_000_000)), unit)
    return keys, args


async def settle_adjustments(script: AsyncScript, prefix: str, clock: str,
                             adjustments: Sequence[Adjustment]) -> None:
    """Settle ``adjustments`` with ``script`` through the client's pool (Redis Cluster):
    one call per identity, a few at a time. See ``RedisStorage.settle``."""
    ways = asyncio.Semaphore(_SETTLING)

    async def settle_one(group: list[Adjustment]) -> None:
        keys, args = settle_call(prefix, clock, group)
        async with ways:
            await script(keys=keys, args=args)

    groups = by_identity(adjustments)
    outcomes = await asyncio.gather(*map(settle_one, groups), return_exceptions=True)
    failed = [(group, outcome) for group, outcome in zip(groups, outcomes, strict=True)
              if isinstance(outcome, BaseException)]
    if failed:
        count = sum(len(group) for group, _ in failed)
        msg = (f"redis could not settle {count} of {len(adjustments)} charge(s): "
               f"{cause(failed[0][1])}")
        raise StorageError(msg) from failed[0][1]

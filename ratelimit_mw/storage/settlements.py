"""Settling reserved charges on Redis, after their responses: one call of settle.lua per
identity (a request's adjustments share one, so it settles atomically)."""

from __future__ import annotations

from collections.abc import Sequence

from redis.commands.core import AsyncScript

from ..decision import Adjustment
from .keys import redis_key
from .per_identity import by_identity, per_identity
from .wire import history_unit

__all__ = ["settle_adjustments", "settle_call", "settlement_groups"]


def settlement_groups(adjustments: Sequence[Adjustment]) -> list[list[Adjustment]]:
    """``adjustments`` grouped by the caller whose counters they move."""
    return by_identity(adjustments, _identity)


def _identity(adjustment: Adjustment) -> str:
    return adjustment.key


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
        unit = history_unit(limit, at, counted)
        keys.append(redis_key(prefix, key, hit.scope, limit.uid))
        args += (limit.algorithm, str(limit.amount), str(limit.period_us),
                 str(limit.capacity), str(delta), str(round(at * 1_000_000)), unit)
    return keys, args


async def settle_adjustments(script: AsyncScript, prefix: str, clock: str,
                             adjustments: Sequence[Adjustment]) -> None:
    """Settle ``adjustments`` with ``script`` through the client's pool (Redis Cluster):
    one call per identity, a few at a time. See ``RedisStorage.settle``."""
    async def settle(group: list[Adjustment]) -> None:
        keys, args = settle_call(prefix, clock, group)
        await script(keys=keys, args=args)

    await per_identity(settlement_groups(adjustments), settle, "settle {} of {} charge(s)")

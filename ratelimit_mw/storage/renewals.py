"""Renewing the leases of concurrency slots held on Redis."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from redis.commands.core import AsyncScript

from ..decision import Lease
from ..errors import StorageError
from .faults import cause
from .keys import redis_key

__all__ = ["renew_leases"]

_RENEWING = 16  # lease renewals (script calls, one per identity) in flight at once


async def renew_leases(script: AsyncScript, prefix: str, clock: str,
                       leases: Sequence[Lease], period_us: int) -> None:
    """Extend ``leases`` by ``period_us`` with the renew ``script``, one call per identity
    and a few at a time; ``clock``: the scripts' clock argument. See ``RedisStorage.renew``."""
    by_identity: dict[str, list[Lease]] = {}
    for lease in leases:
        by_identity.setdefault(lease.key, []).append(lease)
    ways = asyncio.Semaphore(_RENEWING)

    async def renew_one(held: list[Lease]) -> None:
        async with ways:
            await script(
                keys=[redis_key(prefix, lease.key, lease.scope, lease.uid)
                      for lease in held],
                args=[clock, period_us, *(lease.id for lease in held)])

    groups = list(by_identity.values())
    outcomes = await asyncio.gather(*map(renew_one, groups), return_exceptions=True)
    failed = [(group, outcome) for group, outcome in zip(groups, outcomes, strict=True)
              if isinstance(outcome, BaseException)]
    if failed:
        count = sum(len(group) for group, _ in failed)
        msg = (f"redis could not renew {count} of {len(leases)} slot(s): "
               f"{cause(failed[0][1])}")
        raise StorageError(msg) from failed[0][1]

"""Renewing the leases of concurrency slots held on Redis."""

from __future__ import annotations

from collections.abc import Sequence

from redis.commands.core import AsyncScript

from ..decision import Lease
from .keys import redis_key
from .per_identity import by_identity, per_identity

__all__ = ["renew_leases"]


async def renew_leases(script: AsyncScript, prefix: str, clock: str,
                       leases: Sequence[Lease], period_us: int) -> None:
    """Extend ``leases`` by ``period_us`` with the renew ``script``, one call per identity
    and a few at a time; ``clock``: the scripts' clock argument. See ``RedisStorage.renew``."""
    async def renew(held: list[Lease]) -> None:
        await script(keys=[redis_key(prefix, lease.key, lease.scope, lease.uid)
                           for lease in held],
                     args=[clock, period_us, *(lease.id for lease in held)])

    await per_identity(by_identity(leases, _identity), renew, "renew {} of {} slot(s)")


def _identity(lease: Lease) -> str:
    return lease.key

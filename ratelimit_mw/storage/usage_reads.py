"""Reading an identity's usage counters back from Redis."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from ..errors import StorageError
from .base import BUCKET_SECONDS, Granularity, UsageRetention, bucket_range
from .faults import REDIS_FAILURES, cause
from .keys import identity_tag

__all__ = ["read_usage"]


async def read_usage(
    client: Any, prefix: str, retention: UsageRetention, clock: Callable[[], float] | None,
    timeout: float | None, key: str, granularity: Granularity, start: float, end: float,
    unit: str = "requests",
) -> list[tuple[int, int]]:
    """The usage of ``key`` per ``granularity`` bucket from ``start`` to ``end``, on
    Redis's clock (or ``clock``, the tests'), within ``timeout`` seconds. See
    ``RedisStorage.usage``."""
    try:
        async with asyncio.timeout(timeout):
            seconds, micros = await client.time()
            now = seconds + micros / 1_000_000 if clock is None else clock()
            buckets = bucket_range(granularity, start, end, now, retention)
            if not buckets:
                return []
            series = "" if unit == "requests" else f"{unit}:"
            tag = f"{identity_tag(prefix, key)}u:{series}{granularity[0]}:"
            counts = await client.mget([f"{tag}{n}" for n in buckets])
    except REDIS_FAILURES as exc:
        msg = f"redis could not read the usage of {key!r}: {cause(exc)}"
        raise StorageError(msg) from exc
    size = BUCKET_SECONDS[granularity]
    return [(n * size, int(count or 0)) for n, count in zip(buckets, counts, strict=True)]

"""A standalone Redis (``redis://``, ``rediss://``): its client made from a URL, and
forgetting every key of one identity."""

from __future__ import annotations

from typing import Any

from redis.asyncio import BlockingConnectionPool, Redis

from ..errors import StorageError
from .base import DEFAULT_MAX_CONNECTIONS, DEFAULT_POOL_TIMEOUT
from .faults import REDIS_FAILURES, cause
from .keys import glob_escape, identity_tag

__all__ = ["client_from_url", "forget_identity"]


def client_from_url(url: str, timeout: float | None, connect_timeout: float | None,
                    **options: Any) -> Redis:
    """A lazily connecting client with a blocking pool: callers beyond
    ``max_connections`` (default 100) wait up to ``pool_timeout`` seconds (default 5)
    for a connection instead of failing. See ``RedisStorage.from_url``."""
    if timeout is not None:
        options.setdefault("socket_timeout", timeout)
    if connect_timeout is not None or timeout is not None:
        options.setdefault("socket_connect_timeout", connect_timeout or timeout)
    max_connections = options.pop("max_connections", None) or DEFAULT_MAX_CONNECTIONS
    pool_timeout = options.pop("pool_timeout", DEFAULT_POOL_TIMEOUT)
    pool = BlockingConnectionPool.from_url(
        url, max_connections=max_connections, timeout=pool_timeout, **options)
    return Redis.from_pool(pool)


async def forget_identity(client: Any, prefix: str, key: str) -> None:
    """Delete every key of ``key``'s identity (its tag), 500 at a time."""
    pattern = glob_escape(identity_tag(prefix, key)) + "*"
    try:
        batch: list[Any] = []
        async for name in client.scan_iter(match=pattern, count=500):
            batch.append(name)
            if len(batch) >= 500:
                await client.unlink(*batch)
                batch.clear()
        if batch:
            await client.unlink(*batch)
    except REDIS_FAILURES as exc:
        msg = f"redis could not reset {key!r}: {cause(exc)}"
        raise StorageError(msg) from exc

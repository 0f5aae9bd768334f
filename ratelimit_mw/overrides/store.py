"""Where overrides live: in this process, or in Redis where every worker reads them.

On Redis the overrides are one hash (caller → JSON) and a version counter, both under
the ``{overrides}`` hash tag (one Cluster slot); every change bumps the version in the
same transaction and is announced on a pub/sub channel, so workers reload at once, and
a worker that missed the message sees the version move on its next poll.
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from collections.abc import Iterable
from typing import Any

from ..errors import ConfigError, StorageError
from ..storage.faults import REDIS_FAILURES
from ..storage.keys import check_prefix
from ..storage.urls import redacted
from .model import Override

__all__ = ["MemoryOverrideStore", "OverrideStore", "RedisOverrideStore", "override_store_from_url"]

_log = logging.getLogger("ratelimit_mw")


class OverrideStore(ABC):
    """The shared copy of every override, with a version that moves on each change.

    ``set`` and ``delete`` return the override they replaced (None: there was none).
    """

    channel: str | None = None
    """The pub/sub channel changes are announced on (None: poll ``version`` only)."""

    @abstractmethod
    async def load(self) -> tuple[int, list[Override]]:
        """Every stored override, with the version they are at."""

    @abstractmethod
    async def version(self) -> int:
        """The version of the stored overrides (0: none were ever stored)."""

    @abstractmethod
    async def set(self, override: Override) -> Override | None:
        """Store ``override`` (replacing its caller's)."""

    @abstractmethod
    async def delete(self, caller: str) -> Override | None:
        """Remove the override of ``caller``."""

    async def restore(self, overrides: Iterable[Override]) -> None:
        """Write back overrides a storage lost (a Redis that restarted empty)."""
        for override in overrides:
            await self.set(override)

    def subscriber(self) -> Any | None:
        """A pub/sub connection for ``channel``, when this store offers one."""
        return None

    async def announce(self, message: str) -> None:  # noqa: B027 - optional hook
        """Tell every worker ``message`` on ``channel`` (a store of one process has no
        one else to tell)."""

    async def close(self) -> None:  # noqa: B027 - optional hook
        """Release connections."""


class MemoryOverrideStore(OverrideStore):
    """Overrides of this process only (the memory storage's counterpart)."""

    def __init__(self) -> None:
        self._items: dict[str, Override] = {}
        self._version = 0

    async def load(self) -> tuple[int, list[Override]]:
        return self._version, list(self._items.values())

    async def version(self) -> int:
        return self._version

    async def set(self, override: Override) -> Override | None:
        before = self._items.get(override.caller)
        self._items[override.caller] = override
        self._version += 1
        return before

    async def delete(self, caller: str) -> Override | None:
        before = self._items.pop(caller, None)
        if before is not None:
            self._version += 1
        return before


def _decoded(value: Any) -> Override | None:
    """An override from its stored JSON; None (logged) when it can't be read."""
    if value is None:
        return None
    try:
        return Override.from_json(value)
    except (ValueError, KeyError, TypeError) as exc:
        _log.error("ratelimit_mw: skipping an unreadable stored override: %s", str(exc)[:200])
        return None


class RedisOverrideStore(OverrideStore):
    """Overrides in Redis (plain, Sentinel or Cluster), shared by every worker."""

    def __init__(self, client: Any, *, prefix: str = "ratelimit:", owns_client: bool = False,
                 pubsub: bool = True) -> None:
        prefix = check_prefix(prefix)
        self.client = client
        self.hash = f"{prefix}{{overrides}}"
        self.version_key = f"{prefix}{{overrides}}:version"
        self.channel = f"{prefix}overrides:changed" if pubsub else None
        self._owns_client = owns_client

    @classmethod
    def from_url(cls, url: str, *, prefix: str = "ratelimit:") -> RedisOverrideStore:
        """A store on the Redis of a storage URL (redis://, rediss://, Cluster or
        Sentinel; Cluster is polled, the others are also told by pub/sub)."""
        from redis.asyncio import Redis

        from ..storage.cluster import CLUSTER_SCHEMES, cluster_client_from_url
        from ..storage.sentinel import SENTINEL_SCHEMES, sentinel_client_from_url
        from ..storage.urls import check_redis_url

        scheme = url.split("://", 1)[0].lower() if "://" in url else ""
        if scheme in CLUSTER_SCHEMES:
            return cls(cluster_client_from_url(url), prefix=prefix, owns_client=True,
                       pubsub=False)
        if scheme in SENTINEL_SCHEMES:
            return cls(sentinel_client_from_url(url), prefix=prefix, owns_client=True)
        if scheme not in ("redis", "rediss"):
            msg = f"overrides need a Redis storage URL, got {redacted(url)}"
            raise ConfigError(msg)
        check_redis_url(url, scheme)
        client = Redis.from_url(url, socket_timeout=2.0, socket_connect_timeout=2.0)
        return cls(client, prefix=prefix, owns_client=True)

    async def load(self) -> tuple[int, list[Override]]:
        try:
            async with self.client.pipeline(transaction=True) as pipe:
                # The values name their callers. Not HGETALL: redis-py 6.2 to 7's Cluster
                # transactions fail on its reply's callback (under RESP2, their default).
                pipe.hvals(self.hash)
                pipe.get(self.version_key)
                stored, version = await pipe.execute()
        except REDIS_FAILURES as exc:
            raise _storage_error("read", exc) from exc
        items = [_decoded(value) for value in stored]
        return int(version or 0), [item for item in items if item is not None]

    async def version(self) -> int:
        try:
            return int(await self.client.get(self.version_key) or 0)
        except REDIS_FAILURES as exc:
            raise _storage_error("read", exc) from exc

    async def set(self, override: Override) -> Override | None:
        return await self._change(override.caller, override.to_json())

    async def delete(self, caller: str) -> Override | None:
        return await self._change(caller, None)

    async def _change(self, caller: str, value: str | None) -> Override | None:
        try:
            async with self.client.pipeline(transaction=True) as pipe:
                pipe.hget(self.hash, caller)
                if value is None:
                    pipe.hdel(self.hash, caller)
                else:
                    pipe.hset(self.hash, caller, value)
                pipe.incr(self.version_key)
                before, _, version = await pipe.execute()
            if self.channel is not None:
                await self.client.publish(self.channel, str(version))
        except REDIS_FAILURES as exc:
            raise _storage_error("write", exc) from exc
        return _decoded(before)

    def subscriber(self) -> Any | None:
        return self.client.pubsub() if self.channel is not None else None

    async def announce(self, message: str) -> None:
        if self.channel is None:
            return
        try:
            await self.client.publish(self.channel, message)
        except REDIS_FAILURES as exc:
            raise _storage_error("announce a change of", exc) from exc

    async def close(self) -> None:
        if self._owns_client:
            await self.client.aclose()


def _storage_error(what: str, exc: BaseException) -> StorageError:
    return StorageError(f"couldn't {what} the overrides: {type(exc).__name__}: "
                        f"{str(exc)[:200]}")


def override_store_from_url(url: str, *, prefix: str = "ratelimit:") -> OverrideStore:
    """The store matching a storage URL: in memory for ``memory://``, else Redis."""
    if url.lower().startswith("memory://"):
        return MemoryOverrideStore()
    return RedisOverrideStore.from_url(url, prefix=prefix)

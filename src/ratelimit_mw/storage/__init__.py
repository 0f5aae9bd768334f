"""Storages: where counters live. ``storage_from_url`` picks one from a URL."""

from __future__ import annotations

from typing import Any

from ..errors import ConfigError
from .base import Storage
from .cluster import CLUSTER_SCHEMES, cluster_storage_from_url
from .memory import MemoryStorage
from .redis import RedisStorage
from .sentinel import SENTINEL_SCHEMES, sentinel_storage_from_url

__all__ = ["MemoryStorage", "RedisStorage", "Storage", "storage_from_url"]

_SCHEMES = ("memory://, redis://[:password@]host:port/db, rediss://, "
            "redis+cluster://host:port,host:port or redis+sentinel://host:port,host:port/service")


def storage_from_url(url: str, **options: Any) -> Storage:
    """``memory://`` (options: max_keys), ``redis://`` or ``rediss://`` (TLS),
    ``redis+cluster://`` or ``rediss+cluster://`` (Cluster), ``redis+sentinel://``."""
    scheme = url.split("://", 1)[0].lower() if isinstance(url, str) and "://" in url else ""
    if scheme == "memory":
        return MemoryStorage(**options)
    if scheme in ("redis", "rediss"):
        try:
            return RedisStorage.from_url(url, **options)
        except (ValueError, TypeError) as exc:
            msg = f"couldn't use storage URL {url!r}: {exc}"
            raise ConfigError(msg) from exc
    if scheme in CLUSTER_SCHEMES:
        return cluster_storage_from_url(url, **options)
    if scheme in SENTINEL_SCHEMES:
        return sentinel_storage_from_url(url, **options)
    msg = f"unsupported storage URL {url!r}; expected {_SCHEMES}"
    raise ConfigError(msg)

"""Storages: where counters live. ``storage_from_url`` picks one from a URL."""

from __future__ import annotations

from typing import Any

from ..errors import ConfigError
from .base import Storage
from .cluster import CLUSTER_SCHEMES, cluster_storage_from_url
from .memory import MemoryStorage
from .redis import RedisStorage
from .sentinel import SENTINEL_SCHEMES, sentinel_storage_from_url
from .urls import check_redis_url, memory_options, redacted

__all__ = ["MemoryStorage", "RedisStorage", "Storage", "check_storage_url", "storage_from_url"]

_SCHEMES = ("memory://, redis://[:password@]host:port/db, rediss://, "
            "redis+cluster://host:port,host:port or redis+sentinel://host:port,host:port/service")


def check_storage_url(url: str) -> None:
    """Refuse, naming it, a URL ``storage_from_url`` could not use, without connecting
    (Cluster and Sentinel URLs: their scheme; the rest is read when the storage is
    built)."""
    scheme = url.split("://", 1)[0].lower() if "://" in url else ""
    if scheme == "memory":
        MemoryStorage(**memory_options(url))  # checks max_keys; cheap, holds nothing
    elif scheme in ("redis", "rediss"):
        check_redis_url(url, scheme)
    elif scheme not in CLUSTER_SCHEMES and scheme not in SENTINEL_SCHEMES:
        msg = f"unsupported storage URL {redacted(url)}; expected {_SCHEMES}"
        raise ConfigError(msg)


def storage_from_url(url: str, **options: Any) -> Storage:
    """``memory://`` (options: max_keys), ``redis://`` or ``rediss://`` (TLS),
    ``redis+cluster://`` or ``rediss+cluster://`` (Cluster), ``redis+sentinel://``."""
    scheme = url.split("://", 1)[0].lower() if isinstance(url, str) and "://" in url else ""
    if scheme == "memory":
        return MemoryStorage(**{**memory_options(url), **options})
    if scheme in ("redis", "rediss"):
        check_redis_url(url, scheme)
        try:
            return RedisStorage.from_url(url, **options)
        except (ValueError, TypeError) as exc:
            msg = f"couldn't use storage URL {redacted(url)}: {exc}"
            raise ConfigError(msg) from exc
    if scheme in CLUSTER_SCHEMES:
        return cluster_storage_from_url(url, **options)
    if scheme in SENTINEL_SCHEMES:
        return sentinel_storage_from_url(url, **options)
    msg = f"unsupported storage URL {redacted(url)}; expected {_SCHEMES}"
    raise ConfigError(msg)

"""Storages: where counters live. ``storage_from_url`` picks one from a URL."""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qsl

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
        return MemoryStorage(**{**_memory_options(url), **options})
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


def _memory_options(url: str) -> dict[str, Any]:
    """``memory://`` or ``memory://?max_keys=N``: anything else in the URL is refused
    (it would be silently ignored)."""
    where, _, query = url.split("://", 1)[1].partition("?")
    if where not in ("", "/"):
        msg = f"memory storage URL {url!r} takes no host or path; expected 'memory://'"
        raise ConfigError(msg)
    options: dict[str, Any] = {}
    for name, value in parse_qsl(query, keep_blank_values=True):
        if name != "max_keys" or name in options:
            msg = (f"storage URL {url!r}: unknown or repeated option {name!r}; memory:// "
                   f"takes max_keys (memory://?max_keys=100000)")
            raise ConfigError(msg)
        try:
            options[name] = int(value)
        except ValueError:
            msg = f"storage URL {url!r}: max_keys must be a positive integer, got {value!r}"
            raise ConfigError(msg) from None
    return options

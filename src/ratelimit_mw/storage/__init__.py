"""Storages: where counters live. ``storage_from_url`` picks one from a URL."""

from __future__ import annotations

from typing import Any

from ..errors import ConfigError
from .base import Storage
from .memory import MemoryStorage
from .redis import RedisStorage

__all__ = ["MemoryStorage", "RedisStorage", "Storage", "storage_from_url"]

_SCHEMES = "memory://, redis://[:password@]host:port/db or rediss://"


def storage_from_url(url: str, **options: Any) -> Storage:
    """``memory://`` (options: max_keys), ``redis://`` or ``rediss://`` (TLS)."""
    scheme = url.split("://", 1)[0].lower() if isinstance(url, str) and "://" in url else ""
    if scheme == "memory":
        return MemoryStorage(**options)
    if scheme in ("redis", "rediss"):
        try:
            return RedisStorage.from_url(url, **options)
        except (ValueError, TypeError) as exc:
            msg = f"couldn't use storage URL {url!r}: {exc}"
            raise ConfigError(msg) from exc
    msg = f"unsupported storage URL {url!r}; expected {_SCHEMES}"
    raise ConfigError(msg)

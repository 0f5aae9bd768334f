"""Storages: where counters live. ``storage_from_url`` picks one from a URL."""

from __future__ import annotations

import difflib
import inspect
from typing import Any
from urllib.parse import parse_qsl, urlsplit

from redis.asyncio.connection import (
    URL_QUERY_ARGUMENT_PARSERS,
    AbstractConnection,
    Connection,
    SSLConnection,
)

from ..errors import ConfigError
from .base import Storage
from .cluster import CLUSTER_SCHEMES, bad_url, cluster_storage_from_url, redacted
from .memory import MemoryStorage
from .redis import RedisStorage
from .sentinel import SENTINEL_SCHEMES, sentinel_storage_from_url

__all__ = ["MemoryStorage", "RedisStorage", "Storage", "check_storage_url", "storage_from_url"]

_SCHEMES = ("memory://, redis://[:password@]host:port/db, rediss://, "
            "redis+cluster://host:port,host:port or redis+sentinel://host:port,host:port/service")


def check_storage_url(url: str) -> None:
    """Refuse, naming it, a URL ``storage_from_url`` could not use, without connecting
    (Cluster and Sentinel URLs: their scheme; the rest is read when the storage is
    built)."""
    scheme = url.split("://", 1)[0].lower() if "://" in url else ""
    if scheme == "memory":
        MemoryStorage(**_memory_options(url))  # checks max_keys; cheap, holds nothing
    elif scheme in ("redis", "rediss"):
        _check_redis_url(url, scheme)
    elif scheme not in CLUSTER_SCHEMES and scheme not in SENTINEL_SCHEMES:
        msg = f"unsupported storage URL {redacted(url)}; expected {_SCHEMES}"
        raise ConfigError(msg)


def storage_from_url(url: str, **options: Any) -> Storage:
    """``memory://`` (options: max_keys), ``redis://`` or ``rediss://`` (TLS),
    ``redis+cluster://`` or ``rediss+cluster://`` (Cluster), ``redis+sentinel://``."""
    scheme = url.split("://", 1)[0].lower() if isinstance(url, str) and "://" in url else ""
    if scheme == "memory":
        return MemoryStorage(**{**_memory_options(url), **options})
    if scheme in ("redis", "rediss"):
        _check_redis_url(url, scheme)
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


_REDIS_EXAMPLE = "redis://:password@127.0.0.1:6379/0?socket_keepalive=true"


def _redis_url_options(scheme: str) -> frozenset[str]:
    """The query options redis-py takes in a ``redis://`` URL: those it parses, and the
    connection's own arguments (it passes any other on to the connection, which then
    fails at every connect: the limiter would be off, not stopped at start-up)."""
    classes = [AbstractConnection, Connection, *([SSLConnection] if scheme == "rediss" else [])]
    names = {name for cls in classes for name in inspect.signature(cls.__init__).parameters}
    names -= {"self", "kwargs", "host", "port"}
    return frozenset(names | set(URL_QUERY_ARGUMENT_PARSERS) | {"max_connections", "timeout"})


def _check_redis_url(url: str, scheme: str) -> None:
    """Refuse, naming it, what redis-py would take silently or fail on only later: a
    bad port, a database that is not a number (read as 0), an option it does not know."""
    parts = urlsplit(url)
    try:
        parts.port  # noqa: B018 - read for its check
    except ValueError as exc:
        bad_url(url, str(exc), _REDIS_EXAMPLE)
    database = parts.path.removeprefix("/")
    if database and not database.isdigit():
        bad_url(url, f"the database must be a number, got {database!r}", _REDIS_EXAMPLE)
    known = _redis_url_options(scheme)
    for name, _ in parse_qsl(parts.query, keep_blank_values=True):
        if name not in known:
            close = difflib.get_close_matches(name, known, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            bad_url(url, f"unknown option {name!r}{hint}", _REDIS_EXAMPLE)


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

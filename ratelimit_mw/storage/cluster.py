"""Redis Cluster storage: ``redis+cluster://host:port,host:port`` runs the same script.

All keys of one decision carry the identity's hash tag, so its one ``EVALSHA`` goes
to the node that owns that slot. redis-py follows ``MOVED`` and ``ASK`` while slots
move, and on ``NOSCRIPT`` (a node that never saw the script) loads it on every
primary and retries. What still fails becomes ``StorageError`` in ``RedisStorage``.

This module also holds what the Sentinel storage shares: parsing a URL with several
``host:port`` pairs, its query options, and a short retry policy.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from typing import Any, NamedTuple, NoReturn
from urllib.parse import parse_qsl, unquote

from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialWithJitterBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisClusterException
from redis.typing import EncodableT

from ..errors import ConfigError
from .base import DEFAULT_POOL_TIMEOUT, UsageRetention
from .redis import RedisStorage

__all__ = ["cluster_client_from_url", "cluster_storage_from_url"]

CLUSTER_SCHEMES = ("redis+cluster", "rediss+cluster")
_CLUSTER_EXAMPLE = "redis+cluster://10.0.0.1:7000,10.0.0.2:7000[?password=...]"


def cluster_storage_from_url(
    url: str, *, prefix: str = "ratelimit:", timeout: float | None = None,
    clock: Callable[[], float] | None = None,
    usage_retention: UsageRetention = UsageRetention(),  # noqa: B008 - immutable
    **options: Any,
) -> RedisStorage:
    """A ``RedisStorage`` on Redis Cluster; connects lazily, on the first decision.

    ``url`` is ``redis+cluster://[user:password@]host:port[,host:port...][?options]``
    (``rediss+cluster://`` for TLS); the hosts are startup nodes, the rest of the
    cluster is discovered. Query options: ``username``, ``password``, ``client_name``,
    ``socket_timeout``, ``socket_connect_timeout``, ``max_connections`` (per node),
    ``health_check_interval`` and, with TLS, ``ssl_ca_certs``, ``ssl_certfile``,
    ``ssl_keyfile``, ``ssl_cert_reqs``, ``ssl_check_hostname``. ``timeout`` bounds
    each call. Beyond ``max_connections`` (default 100) calls in flight, callers wait
    for a turn, up to ``pool_timeout`` seconds (default 5). ``clock`` is for tests
    only; other options go to ``RedisCluster``.
    """
    client = cluster_client_from_url(url, timeout=timeout, **options)
    return RedisStorage(client, prefix=prefix, clock=clock, owns_client=True,
                        usage_retention=usage_retention, timeout=timeout)


def cluster_client_from_url(
    url: str, *, timeout: float | None = None, **options: Any,
) -> RedisCluster:
    """The ``redis.asyncio.RedisCluster`` that ``cluster_storage_from_url`` uses."""
    parsed = parse_nodes_url(url, CLUSTER_SCHEMES, default_port=6379, example=_CLUSTER_EXAMPLE)
    if parsed.path not in ("", "0"):
        bad_url(url, f"Redis Cluster has only database 0, not {parsed.path!r}", _CLUSTER_EXAMPLE)
    tls = parsed.scheme == "rediss+cluster"
    allowed = {**CONNECTION_OPTIONS, **(_TLS_OPTIONS if tls else {})}
    kwargs = connection_options(url, parsed, allowed, timeout=timeout, example=_CLUSTER_EXAMPLE)
    if tls:
        kwargs["ssl"] = True
    kwargs["retry"] = short_retry()
    # On MOVED, patch the one slot; redis-py's default also reconnects everything on
    # every 5th MOVED, which breaks the calls in flight while a slot moves.
    kwargs["reinitialize_steps"] = 0
    kwargs.update(options)
    pool_timeout = kwargs.pop("pool_timeout", DEFAULT_POOL_TIMEOUT)
    nodes = [ClusterNode(host, port) for host, port in parsed.hosts]
    try:
        client = _QueueingCluster(startup_nodes=nodes, **kwargs)
    except (TypeError, ValueError, RedisClusterException) as exc:
        bad_url(url, str(exc), _CLUSTER_EXAMPLE, cause=exc)
    client.queue = ConnectionQueue(client.connection_kwargs["max_connections"], pool_timeout)
    return client


class _QueueingCluster(RedisCluster):
    """A ``RedisCluster`` fit for bursts of concurrent one-slot calls.

    Commands queue for a connection (see ``ConnectionQueue``). redis-py routes the
    first commands before it knows the slots, by a guess: here the slot map is
    loaded first, or a burst would meet a storm of MOVED replies. After NOSCRIPT,
    the waiting calls load the script one at a time, not all at once.
    """

    queue: ConnectionQueue | None = None
    _loading: asyncio.Lock | None = None

    async def execute_command(self, *args: EncodableT, **kwargs: Any) -> Any:
        if self.queue is None:  # built without cluster_client_from_url
            return await super().execute_command(*args, **kwargs)
        async with self.queue.turn():
            if self._initialize:
                await self.initialize()
            try:
                return await super().execute_command(*args, **kwargs)
            except AttributeError as exc:
                # redis-py 8 race: after a node fails, one call closes connections that
                # another is still opening (``None.writelines``). It is a lost connection.
                msg = f"connection closed while in use ({exc})"
                raise RedisConnectionError(msg) from exc

    async def script_load(self, script: str | bytes) -> str:  # type: ignore[override]
        if self._loading is None:
            self._loading = asyncio.Lock()
        async with self._loading:
            return await super().script_load(script)


# -- shared with the Sentinel storage ----------------------------------------------


class NodesURL(NamedTuple):
    """A URL naming several servers: ``scheme://[user:password@]h:p,h:p/path?query``."""

    scheme: str
    username: str | None
    password: str | None
    hosts: tuple[tuple[str, int], ...]
    path: str
    query: dict[str, str]


def parse_nodes_url(url: str, schemes: tuple[str, ...], *, default_port: int,
                    example: str) -> NodesURL:
    """Split a several-hosts URL, or raise ``ConfigError`` naming it."""
    if not isinstance(url, str) or "://" not in url:
        bad_url(url, "not a URL", example)
    scheme, rest = url.split("://", 1)
    if scheme.lower() not in schemes:
        bad_url(url, f"the scheme must be one of {', '.join(schemes)}", example)
    rest, _, query_text = rest.partition("?")
    netloc, _, path = rest.partition("/")
    userinfo, _, host_list = netloc.rpartition("@")
    username, has_password, password = userinfo.partition(":")
    hosts = tuple(_host_port(url, item, default_port, example) for item in host_list.split(","))
    try:
        pairs = parse_qsl(query_text, keep_blank_values=True, strict_parsing=bool(query_text))
    except ValueError as exc:
        bad_url(url, f"malformed query: {exc}", example, cause=exc)
    query = dict(pairs)
    if len(query) != len(pairs):
        bad_url(url, "an option is given twice", example)
    return NodesURL(scheme.lower(), unquote(username) or None,
                    unquote(password) if has_password else None,
                    hosts, unquote(path.rstrip("/")), query)


def _host_port(url: str, item: str, default_port: int, example: str) -> tuple[str, int]:
    """``host``, ``host:port`` or ``[v6]:port``."""
    if item.startswith("["):
        host, _, tail = item[1:].partition("]")
        if tail and not tail.startswith(":"):
            bad_url(url, f"bad address {item!r}", example)
        port_text = tail[1:]
    else:
        host, _, port_text = item.partition(":")
        if ":" in port_text:
            bad_url(url, f"write the IPv6 address {item!r} in brackets", example)
    if not host:
        bad_url(url, "every address needs a host", example)
    if not port_text:
        return host, default_port
    if not port_text.isascii() or not port_text.isdigit() or not 0 < int(port_text) < 65536:
        bad_url(url, f"bad port in {item!r}", example)
    return host, int(port_text)


def _seconds(text: str) -> float:
    value = float(text)
    if not math.isfinite(value) or value <= 0:
        msg = "must be a positive number of seconds"
        raise ValueError(msg)
    return value


def _count(text: str) -> int:
    value = int(text)
    if value < 1:
        msg = "must be a positive integer"
        raise ValueError(msg)
    return value


def _flag(text: str) -> bool:
    words = {"true": True, "yes": True, "1": True, "false": False, "no": False, "0": False}
    if text.lower() not in words:
        msg = "must be true or false"
        raise ValueError(msg)
    return words[text.lower()]


CONNECTION_OPTIONS: dict[str, Callable[[str], Any]] = {
    "username": str, "password": str, "client_name": str,
    "socket_timeout": _seconds, "socket_connect_timeout": _seconds,
    "max_connections": _count, "health_check_interval": _seconds,
}
_TLS_OPTIONS: dict[str, Callable[[str], Any]] = {
    "ssl_ca_certs": str, "ssl_certfile": str, "ssl_keyfile": str, "ssl_cert_reqs": str,
    "ssl_check_hostname": _flag,
}


def connection_options(
    url: str, parsed: NodesURL, allowed: Mapping[str, Callable[[str], Any]], *,
    timeout: float | None, example: str,
) -> dict[str, Any]:
    """redis-py keyword arguments from the URL's credentials, its query and ``timeout``."""
    options: dict[str, Any] = {}
    if timeout is not None:
        options["socket_timeout"] = options["socket_connect_timeout"] = timeout
    if parsed.username is not None:
        options["username"] = parsed.username
    if parsed.password is not None:
        options["password"] = parsed.password
    for name, text in parsed.query.items():
        if name not in allowed:
            bad_url(url, f"unknown option {name!r}; known: {', '.join(sorted(allowed))}", example)
        try:
            options[name] = allowed[name](text)
        except ValueError as exc:
            bad_url(url, f"option {name!r} {exc}", example, cause=exc)
    return options


class ConnectionQueue:
    """At most ``size`` commands in flight; the others wait up to ``timeout`` s for a turn.

    redis-py's cluster and Sentinel clients raise ``MaxConnectionsError`` at once
    when every connection is busy; with this queue a burst larger than the pool
    waits instead, like ``redis://`` with its blocking pool.
    """

    __slots__ = ("_semaphore", "size", "timeout")

    def __init__(self, size: int, timeout: float) -> None:
        self.size = size
        self.timeout = timeout
        self._semaphore: asyncio.Semaphore | None = None

    def __repr__(self) -> str:
        return f"ConnectionQueue(size={self.size}, timeout={self.timeout})"

    @asynccontextmanager
    async def turn(self) -> AsyncIterator[None]:
        """Hold one of the ``size`` turns for the duration of a command."""
        if self._semaphore is None:
            self._semaphore = asyncio.Semaphore(self.size)
        try:
            async with asyncio.timeout(self.timeout):
                await self._semaphore.acquire()
        except TimeoutError as exc:
            msg = f"no free connection within {self.timeout} s ({self.size} in use)"
            raise RedisConnectionError(msg) from exc
        try:
            yield
        finally:
            self._semaphore.release()




def short_retry() -> Retry:
    """Three quick retries (10 ms to 250 ms apart): a rate limiter must answer fast."""
    return Retry(ExponentialWithJitterBackoff(base=0.01, cap=0.25), retries=3)


def redacted(url: object) -> str:
    """The URL with its passwords replaced by ``***``, fit for an error message."""
    if not isinstance(url, str) or "://" not in url:
        return repr(url)
    scheme, rest = url.split("://", 1)
    rest, mark, query = rest.partition("?")
    netloc, slash, path = rest.partition("/")
    userinfo, _, hosts = netloc.rpartition("@")
    user, colon, _password = userinfo.partition(":")
    if colon:
        netloc = f"{user}:***@{hosts}"
    if query:
        query = "&".join(
            f"{name}=***" if "password" in name.lower() else f"{name}{sep}{value}"
            for name, sep, value in (part.partition("=") for part in query.split("&"))
        )
    return repr(f"{scheme}://{netloc}{slash}{path}{mark}{query}")


def bad_url(
    url: object, reason: str, example: str, *, cause: Exception | None = None,
) -> NoReturn:
    """Raise ``ConfigError`` naming the URL (passwords hidden), why, and a good one."""
    msg = f"couldn't use storage URL {redacted(url)}: {reason}; expected e.g. {example!r}"
    raise ConfigError(msg) from cause

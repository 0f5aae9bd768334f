"""Redis Sentinel storage: ``redis+sentinel://host:port,host:port/service`` follows failovers.

The sentinels are asked for the current primary of ``service`` whenever a connection
is made; after a failover, connections to the old primary fail (or answer READONLY)
and are made again to the new one. Until the failover completes, decisions raise
``StorageError``, and the caller's failure policy answers.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from redis.asyncio import Redis
from redis.asyncio.sentinel import Sentinel

from .base import DEFAULT_MAX_CONNECTIONS, DEFAULT_POOL_TIMEOUT, UsageRetention
from .pool import ConnectionQueue, short_retry
from .redis import RedisStorage
from .urls import CONNECTION_OPTIONS, bad_url, connection_options, parse_nodes_url

__all__ = ["sentinel_client_from_url", "sentinel_storage_from_url"]

SENTINEL_SCHEMES = ("redis+sentinel",)
_EXAMPLE = "redis+sentinel://10.0.0.1:26379,10.0.0.2:26379/mymaster[/db][?password=...]"
_SENTINEL_OPTIONS: dict[str, Callable[[str], Any]] = {
    "sentinel_username": str, "sentinel_password": str,
}


def sentinel_storage_from_url(
    url: str, *, prefix: str = "ratelimit:", timeout: float | None = None,
    usage_retention: UsageRetention = UsageRetention(),  # noqa: B008 - immutable
    connect_timeout: float | None = None, **options: Any,
) -> RedisStorage:
    """A ``RedisStorage`` on the primary that Sentinel names; connects lazily.

    ``url`` is ``redis+sentinel://[user:password@]host:port[,host:port...]/service[/db]``
    with the sentinels' addresses (port 26379 by default). The credentials, and the
    ``username`` and ``password`` options, are the primary's; ``sentinel_username``
    and ``sentinel_password`` are the sentinels'. Other query options:
    ``client_name``, ``socket_timeout``, ``socket_connect_timeout``,
    ``max_connections``, ``health_check_interval``. ``timeout`` bounds each call,
    also to the sentinels; ``connect_timeout`` (default: ``timeout``) the set-up of a
    connection, which decisions arriving meanwhile wait for. Callers beyond
    ``max_connections`` (default 100) wait for a turn, up to ``pool_timeout`` seconds
    (default 5). Other options go to redis-py (``sentinel_kwargs`` to the sentinels'
    clients).
    """
    client = sentinel_client_from_url(url, timeout=timeout, connect_timeout=connect_timeout,
                                    **options)
    return RedisStorage(client, prefix=prefix, owns_client=True, usage_retention=usage_retention,
                        timeout=timeout, connect_timeout=connect_timeout)


def sentinel_client_from_url(
    url: str, *, timeout: float | None = None, connect_timeout: float | None = None,
    **options: Any,
) -> Redis:
    """The ``redis.asyncio.Redis`` client of the primary that ``sentinel_storage_from_url`` uses.

    Closing it also closes the connections to the sentinels.
    """
    parsed = parse_nodes_url(url, SENTINEL_SCHEMES, default_port=26379, example=_EXAMPLE)
    service, _, db = parsed.path.partition("/")
    if not service:
        bad_url(url, "the path must name the service Sentinel monitors", _EXAMPLE)
    if db and not (db.isascii() and db.isdigit()):
        bad_url(url, f"the database after the service must be a number, not {db!r}", _EXAMPLE)
    kwargs = connection_options(url, parsed, {**CONNECTION_OPTIONS, **_SENTINEL_OPTIONS},
                                timeout=timeout, example=_EXAMPLE)
    if connect_timeout is not None:
        kwargs["socket_connect_timeout"] = connect_timeout
    to_sentinels: dict[str, Any] = {
        name: kwargs[name] for name in ("socket_timeout", "socket_connect_timeout")
        if name in kwargs
    }
    for name in ("username", "password"):
        if f"sentinel_{name}" in kwargs:
            to_sentinels[name] = kwargs.pop(f"sentinel_{name}")
    to_sentinels["retry"] = short_retry()
    kwargs["retry"] = short_retry()
    if db:
        kwargs["db"] = int(db)
    kwargs.update(options)
    to_sentinels.update(kwargs.pop("sentinel_kwargs", None) or {})
    pool_timeout = kwargs.pop("pool_timeout", DEFAULT_POOL_TIMEOUT)
    if kwargs.get("max_connections") is None:
        kwargs["max_connections"] = DEFAULT_MAX_CONNECTIONS
    # redis-py before 8.2 leaves Sentinel() untyped; 8.2 annotates it.
    sentinel = Sentinel(  # type: ignore[no-untyped-call, unused-ignore]
        list(parsed.hosts), sentinel_kwargs=to_sentinels,
    )
    client = sentinel.master_for(service, redis_class=_SentinelPrimary, **kwargs)
    try:
        client.connection_pool.make_connection()  # refuses unknown options now, not per request
    except (TypeError, ValueError) as exc:
        bad_url(url, str(exc), _EXAMPLE, cause=exc)
    client.sentinel_manager = sentinel
    client.queue = ConnectionQueue(kwargs["max_connections"], pool_timeout)
    return client  # type: ignore[no-any-return]


class _SentinelPrimary(Redis):
    """The primary's client: queues for a connection (see ``ConnectionQueue``), and
    closes the sentinels' connections with its own."""

    queue: ConnectionQueue | None = None
    sentinel_manager: Sentinel | None = None

    async def execute_command(self, *args: Any, **options: Any) -> Any:
        if self.queue is None:
            return await super().execute_command(*args, **options)  # type: ignore[no-untyped-call]
        async with self.queue.turn():
            return await super().execute_command(*args, **options)  # type: ignore[no-untyped-call]

    async def aclose(self, close_connection_pool: bool | None = None) -> None:
        try:
            await super().aclose(close_connection_pool)
        finally:
            if self.sentinel_manager is not None:
                # One by one: Sentinel.aclose() is only in redis-py 8.1 and later.
                for sentinel in self.sentinel_manager.sentinels:
                    await sentinel.aclose()

"""Redis Cluster storage: ``redis+cluster://host:port,host:port`` runs the same script.

All keys of one decision carry the identity's hash tag, so its one ``EVALSHA`` goes
to the node that owns that slot. redis-py follows ``MOVED`` and ``ASK`` while slots
move, and on ``NOSCRIPT`` (a node that never saw the script) loads it on every
primary and retries. While a slot migrates, a script whose keys are split between the
two nodes (or not made yet) gets ``TRYAGAIN``: it is tried again, a little later each
time, until it runs or the caller's timeout ends it. What still fails becomes
``StorageError`` in ``RedisStorage``.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.exceptions import ClusterError, RedisClusterException, TryAgainError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.typing import EncodableT

from .base import DEFAULT_POOL_TIMEOUT, UsageRetention
from .pool import ConnectionQueue, PatientConnection, PatientSSLConnection, short_retry
from .redis import RedisStorage
from .urls import CONNECTION_OPTIONS, TLS_OPTIONS, bad_url, connection_options, parse_nodes_url

__all__ = ["cluster_client_from_url", "cluster_storage_from_url"]

CLUSTER_SCHEMES = ("redis+cluster", "rediss+cluster")
_CLUSTER_EXAMPLE = "redis+cluster://10.0.0.1:7000,10.0.0.2:7000[?password=...]"
# A slot in migration answers TRYAGAIN until its keys are on one node: tried again after
# these pauses (doubling), for at most this long when no timeout is given (a slot with
# few keys moves in milliseconds; the caller's timeout ends it sooner).
_FIRST_PAUSE = 0.005
_LONGEST_PAUSE = 0.05
_TRYING_AGAIN_FOR = 5.0


def cluster_storage_from_url(
    url: str, *, prefix: str = "ratelimit:", timeout: float | None = None,
    usage_retention: UsageRetention = UsageRetention(),  # noqa: B008 - immutable
    connect_timeout: float | None = None, **options: Any,
) -> RedisStorage:
    """A ``RedisStorage`` on Redis Cluster; connects lazily, on the first decision.

    ``url`` is ``redis+cluster://[user:password@]host:port[,host:port...][?options]``
    (``rediss+cluster://`` for TLS); the hosts are startup nodes, the rest of the
    cluster is discovered. Query options: ``username``, ``password``, ``client_name``,
    ``socket_timeout``, ``socket_connect_timeout``, ``max_connections`` (per node),
    ``health_check_interval`` and, with TLS, ``ssl_ca_certs``, ``ssl_certfile``,
    ``ssl_keyfile``, ``ssl_cert_reqs``, ``ssl_check_hostname``. ``timeout`` bounds
    each call, ``connect_timeout`` (default: ``timeout``) the set-up of a connection,
    which decisions arriving meanwhile wait for. Beyond ``max_connections`` (default
    100) calls in flight, callers wait for a turn, up to ``pool_timeout`` seconds
    (default 5). Other options go to ``RedisCluster``.
    """
    client = cluster_client_from_url(url, timeout=timeout, connect_timeout=connect_timeout,
                                    **options)
    return RedisStorage(client, prefix=prefix, owns_client=True, usage_retention=usage_retention,
                        timeout=timeout, connect_timeout=connect_timeout)


def cluster_client_from_url(
    url: str, *, timeout: float | None = None, connect_timeout: float | None = None,
    **options: Any,
) -> RedisCluster:
    """The ``redis.asyncio.RedisCluster`` that ``cluster_storage_from_url`` uses."""
    parsed = parse_nodes_url(url, CLUSTER_SCHEMES, default_port=6379, example=_CLUSTER_EXAMPLE)
    if parsed.path not in ("", "0"):
        bad_url(url, f"Redis Cluster has only database 0, not {parsed.path!r}", _CLUSTER_EXAMPLE)
    tls = parsed.scheme == "rediss+cluster"
    allowed = {**CONNECTION_OPTIONS, **(TLS_OPTIONS if tls else {})}
    kwargs = connection_options(url, parsed, allowed, timeout=timeout, example=_CLUSTER_EXAMPLE)
    if connect_timeout is not None:
        kwargs["socket_connect_timeout"] = connect_timeout
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
    # RedisCluster takes no connection class: set it where nodes, known and to be
    # discovered, take theirs (the nodes manager's startup nodes: every redis-py has them).
    patient = PatientSSLConnection if tls else PatientConnection
    client.connection_kwargs["connection_class"] = patient
    for node in client.nodes_manager.startup_nodes.values():
        node.connection_class = patient
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
            pause = _FIRST_PAUSE
            deadline = time.monotonic() + _TRYING_AGAIN_FOR
            while True:
                try:
                    return await super().execute_command(*args, **kwargs)
                except AttributeError as exc:
                    # redis-py 8 race: after a node fails, one call closes connections
                    # that another is still opening (``None.writelines``): a lost one.
                    msg = f"connection closed while in use ({exc})"
                    raise RedisConnectionError(msg) from exc
                except (TryAgainError, ClusterError) as exc:
                    # redis-py tries a TRYAGAIN 16 times within about 0.4 s, then gives
                    # up with "TTL exhausted": the slot is still moving, so wait on.
                    if not _slot_moving(exc) or time.monotonic() + pause > deadline:
                        raise
                await asyncio.sleep(pause)
                pause = min(2 * pause, _LONGEST_PAUSE)

    async def script_load(self, script: str | bytes) -> str:  # type: ignore[override]
        if self._loading is None:
            self._loading = asyncio.Lock()
        async with self._loading:
            return await super().script_load(script)


def _slot_moving(exc: Exception) -> bool:
    """True for redis-py's errors of a slot in migration (``TRYAGAIN``, or its retries of
    one run out)."""
    return isinstance(exc, TryAgainError) or str(exc).startswith("TTL exhausted")

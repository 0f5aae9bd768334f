"""Redis storage: one EVALSHA per request, decided on the Redis server's clock."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import math
import os
import secrets
from collections.abc import Callable, Sequence
from importlib.resources import files
from typing import TYPE_CHECKING, Any, Literal

from redis import exceptions as redis_errors
from redis.asyncio import BlockingConnectionPool, Redis
from redis.asyncio.connection import Connection
from redis.commands.core import AsyncScript

from ..decision import Lease, Verdict
from ..errors import ConfigError, StorageError
from ..policy import ALGORITHM_NAMES, Hit
from .base import (
    BUCKET_SECONDS,
    Granularity,
    Storage,
    UsageRetention,
    bucket_range,
    decision_from,
    merge_hits,
)
from .keys import check_prefix, identity_tag, redis_key
from .wire import (
    checkout,
    exchange,
    pack_plan,
    pack_release,
    pack_script_load,
    slots_taken,
)

if TYPE_CHECKING:
    from .cluster import ConnectionQueue

__all__ = ["RedisStorage", "decide_script_source"]

_Kind = Literal["decide", "release"]
_Slots = tuple[str, tuple[tuple[str, str], ...], str]
"""The concurrency slots a decision may take: its identity, ``(scope, uid)`` of each
slot, and the lease id."""
_Queued = tuple[_Kind, bytes, "asyncio.Future[Any]", float, _Slots | None]
"""A packed command waiting for the next pipeline flush, the future of its reply, when
its caller stops waiting (loop time; inf: never), and the slots a decision may take."""

# RedisClusterException (no topology, slot not covered) is not a RedisError.
_FAILURES = (redis_errors.RedisError, redis_errors.RedisClusterException, OSError,
             asyncio.TimeoutError)


def decide_script_source() -> str:
    """The decision script: the prelude, one file per algorithm, then the driver."""
    lua = files("ratelimit_mw.storage") / "lua"
    parts = ["prelude", *ALGORITHM_NAMES, "concurrency", "calendar_month", "decide"]
    return "\n".join((lua / f"{name}.lua").read_text(encoding="utf-8") for name in parts)


class _LeaseIds:
    """Lease ids unique across processes: a random prefix per process, then a count
    (cheaper than a random token per request)."""

    __slots__ = ("_count", "_prefix")

    def __init__(self) -> None:
        self.renew()

    def renew(self) -> None:
        self._prefix = secrets.token_hex(8)
        self._count = itertools.count()

    def __call__(self) -> str:
        return f"{self._prefix}{next(self._count):x}"


_lease_id = _LeaseIds()
# A worker forked after this import (gunicorn --preload) must not repeat its parent's ids.
os.register_at_fork(after_in_child=_lease_id.renew)


class RedisStorage(Storage):
    """Counters in Redis, shared by every process that uses the same server.

    Each decision is one ``EVALSHA`` (reloaded on ``NOSCRIPT``), whatever the number
    of limits; time comes from Redis's ``TIME``, so app servers with skewed clocks
    agree. All keys of one identity share a hash slot, so it runs on Redis Cluster.
    Errors are raised as ``StorageError``; what to do then is the caller's policy.
    """

    __slots__ = ("_batch", "_client", "_clock", "_encode", "_flushes", "_owns_client",
                 "_script", "_usage_spec", "pipeline", "prefix", "retention", "timeout")

    def __init__(
        self,
        client: Redis | Any,
        *,
        prefix: str = "ratelimit:",
        clock: Callable[[], float] | None = None,
        owns_client: bool = False,
        usage_retention: UsageRetention = UsageRetention(),  # noqa: B008 - immutable
        pipeline: bool | None = None,
        timeout: float | None = None,
    ) -> None:
        self.prefix = check_prefix(prefix)
        # Seconds within which each pipelined batch must be answered (None: only the
        # client's socket timeout bounds it); a caller may ask for less (decide(timeout=)).
        self.timeout = timeout
        # Decisions asked for in the same event-loop tick go out as one pipeline: one
        # write and one read for many requests. Plain Redis only (Cluster routes per key).
        self.pipeline = isinstance(client, Redis) if pipeline is None else pipeline
        if self.pipeline and not isinstance(client, Redis):
            msg = (f"pipeline=True needs a redis.asyncio.Redis client, not "
                   f"{type(client).__name__}; leave pipeline unset for Redis Cluster")
            raise ConfigError(msg)
        self._batch: list[_Queued] = []
        self._flushes: set[asyncio.Task[None]] = set()
        self.retention = UsageRetention(*usage_retention).check()
        self._usage_spec = f"{self.retention.hours},{self.retention.days}"  # see decide.lua
        self._client = client
        self._owns_client = owns_client
        # Tests only: decide on this clock instead of Redis's TIME, so that the
        # differential tests can drive memory and Redis on the same simulated time.
        self._clock = clock
        self._script: AsyncScript = client.register_script(decide_script_source())
        # Keys packed by hand are encoded as redis-py would (the client's encoding).
        self._encode: Callable[[str], bytes] = (
            client.get_encoder().encode if self.pipeline else str.encode)

    @classmethod
    def from_url(
        cls, url: str, *, prefix: str = "ratelimit:", timeout: float | None = None,
        clock: Callable[[], float] | None = None,
        usage_retention: UsageRetention = UsageRetention(),  # noqa: B008 - immutable
        **options: Any,
    ) -> RedisStorage:
        """Connect lazily to ``redis://`` or ``rediss://``; ``timeout`` bounds each call.

        With ``max_connections``, callers beyond it wait for a free connection (up to
        ``pool_timeout`` seconds) instead of failing. ``clock`` is for tests only (see
        ``__init__``); other options go to redis-py.
        """
        if timeout is not None:
            options.setdefault("socket_timeout", timeout)
            options.setdefault("socket_connect_timeout", timeout)
        max_connections = options.pop("max_connections", None)
        pool_timeout = options.pop("pool_timeout", 5.0)
        if max_connections is not None:
            pool = BlockingConnectionPool.from_url(
                url, max_connections=max_connections, timeout=pool_timeout, **options)
            client = Redis.from_pool(pool)
        else:
            client = Redis.from_url(url, **options)
        return cls(client, prefix=prefix, clock=clock, owns_client=True,
                   usage_retention=usage_retention, timeout=timeout)

    @property
    def client(self) -> Redis:
        """The underlying ``redis.asyncio`` client."""
        return self._client

    def __repr__(self) -> str:
        return f"RedisStorage(prefix={self.prefix!r}, client={self._client!r})"

    async def decide(
        self, key: str, hits: Sequence[Hit], *, usage: bool = False,
        timeout: float | None = None,
    ) -> Verdict:
        """See ``Storage.decide``; with ``timeout``, a decision not answered within that
        many seconds raises ``StorageError`` (decisions pipelined together share one
        timer, cheaper than one per call)."""
        hits = merge_hits(hits)
        if not hits and not usage:
            return Verdict(True, ())
        tag = identity_tag(self.prefix, key)
        clock = "" if self._clock is None else str(round(self._clock() * 1_000_000))
        spec = self._usage_spec if usage else ""
        try:
            if self.pipeline:
                plan = pack_plan(self._script.sha,
                                 hits if isinstance(hits, tuple) else tuple(hits), usage)
                slots = plan.slots
                lease_id = _lease_id() if slots else ""
                command = plan.command(self._encode(tag), clock.encode(), lease_id.encode(),
                                       spec.encode())
                reply = await self._queue("decide", command, timeout,
                                          (key, slots, lease_id) if slots else None)
            else:
                slots = slots_taken(hits)
                lease_id = _lease_id() if slots else ""
                keys = [redis_key(self.prefix, key, hit.scope, hit.limit.uid) for hit in hits]
                if usage:
                    keys.append(f"{tag}u:")  # the usage buckets' prefix (see decide.lua)
                args: list[str | int] = [clock, lease_id, spec]
                for hit in hits:
                    limit = hit.limit
                    args += (limit.algorithm, limit.amount, limit.period_us, limit.capacity,
                             hit.cost)
                async with asyncio.timeout(timeout):
                    reply = await self._script(keys=keys, args=args)
        except _FAILURES as exc:
            msg = f"redis could not decide for {len(hits)} limit(s): {exc}"
            raise StorageError(msg) from exc
        allowed = bool(reply[0])
        leases = tuple(Lease(key, scope, uid, lease_id) for scope, uid in slots
                       ) if allowed and lease_id else ()
        return Verdict(allowed, tuple(
            decision_from(hit, bool(reply[i]), reply[i + 1], reply[i + 2], reply[i + 3])
            for hit, i in zip(hits, range(2, len(reply), 4), strict=True)
        ), leases, reply[1] / 1_000_000)

    def _queue(self, kind: _Kind, command: bytes, timeout: float | None = None,
               slots: _Slots | None = None) -> asyncio.Future[Any]:
        """Queue one command for the next flush (queued at once, so a caller cancelled
        right after still has its command sent). Its caller waits at most the shorter of
        ``timeout`` and the storage's timeout (a release at least 1 s, as a slot not
        given back stays taken for its whole lease)."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        if not self._batch:
            loop.call_soon(self._flush, loop)
        wait = timeout if self.timeout is None else (
            self.timeout if timeout is None else min(timeout, self.timeout))
        if kind == "release" and wait is not None:
            wait = max(1.0, wait)
        self._batch.append((kind, command, future,
                            math.inf if wait is None else loop.time() + wait, slots))
        return future

    def _flush(self, loop: asyncio.AbstractEventLoop) -> None:
        batch, self._batch = self._batch, []
        task = loop.create_task(self._send(batch))
        self._flushes.add(task)  # a reference, so the task is not collected mid-flight
        task.add_done_callback(self._flushes.discard)

    async def _send(self, batch: list[_Queued]) -> None:
        """One round trip for the whole batch; NOSCRIPT (a restarted Redis) loads the
        script again and re-runs only the decisions that missed it.

        A caller still waiting at its deadline gets a TimeoutError, but the exchange goes
        on: the connection (perhaps still being set up) stays usable for the next batch.
        Only far past the last deadline (ten times the wait, at least a second) is the
        exchange cut off and its connection closed.
        """
        loop = asyncio.get_running_loop()
        start = loop.time()
        latest = max(deadline for _, _, _, deadline, _ in batch)
        bounded = latest != math.inf
        timer = _Expiry(loop, batch)
        pool = self._client.connection_pool
        # Sentinel with max_connections: wait for a turn rather than fail on a full pool.
        queue: ConnectionQueue | None = getattr(self._client, "queue", None)
        turn = contextlib.AsyncExitStack() if queue is not None else None
        connection = None
        try:
            async with asyncio.timeout_at(
                    latest + max(1.0, 10 * (latest - start)) if bounded else None):
                if turn is not None:
                    await turn.enter_async_context(queue.turn())  # type: ignore[union-attr]
                connection = await checkout(pool)
                replies = await self._pipelined(batch, connection, bounded)
                missed = [i for i, reply in enumerate(replies)
                          if isinstance(reply, redis_errors.NoScriptError)
                          and not batch[i][2].done()]
                if missed:  # load it on the connection we hold (a queue turn is ours)
                    loaded = await exchange(connection, [pack_script_load(decide_script_source())],
                                            bounded=bounded)
                    if isinstance(loaded[0], Exception):
                        raise loaded[0]
                    again = await self._pipelined([batch[i] for i in missed], connection, bounded)
                    for i, reply in zip(missed, again, strict=True):
                        replies[i] = reply
        except BaseException as exc:  # handed to every waiter, then re-raised if not an error
            for _, _, future, _, _ in batch:
                if future.done():
                    continue
                if isinstance(exc, asyncio.CancelledError):
                    future.cancel()
                else:
                    future.set_exception(exc)
            if not isinstance(exc, Exception):
                raise
            return
        finally:
            timer.cancel()
            if connection is not None:  # outside the deadline: a release is never cut off
                await pool.release(connection)
            if turn is not None:
                await turn.aclose()
        for (_, _, future, _, slots), reply in zip(batch, replies, strict=True):
            if future.done():
                # Its caller gave up (a timeout) after it was sent: the command stands,
                # but slots it took for nobody go back at once.
                if slots is not None and isinstance(reply, list) and reply and reply[0] == 1:
                    self._abandon(slots)
                continue
            if isinstance(reply, Exception):
                future.set_exception(reply)
            else:
                future.set_result(reply)

    async def _pipelined(self, batch: list[_Queued], connection: Connection,
                         bounded: bool = False) -> list[Any]:
        """The batch's commands in one write on ``connection``; its replies in order
        (``bounded``: under a deadline, see ``exchange``).

        A decision whose caller stopped waiting before the connection was ready is not
        sent (its reply is None): the failure policy has answered that request, so Redis
        must not count it, nor hold a slot for it. Slots given back always go.
        """
        live = [i for i, (kind, _, future, _, _) in enumerate(batch)
                if kind == "release" or not future.done()]
        replies: list[Any] = [None] * len(batch)
        if live:
            got = await exchange(connection, [batch[i][1] for i in live], bounded=bounded)
            for i, reply in zip(live, got, strict=True):
                replies[i] = reply
        return replies

    def _abandon(self, slots: _Slots) -> None:
        """Give back the slots of an admitted decision whose caller had given up."""
        key, taken, lease_id = slots
        for scope, uid in taken:
            self._queue_release(Lease(key, scope, uid, lease_id)).add_done_callback(_retrieve)

    def _queue_release(self, lease: Lease) -> asyncio.Future[Any]:
        """The ZREM that gives ``lease``'s slot back, queued for the next flush."""
        name = redis_key(self.prefix, lease.key, lease.scope, lease.uid)
        return self._queue("release", pack_release(self._encode(name), lease.id.encode()))

    async def release(self, leases: Sequence[Lease]) -> None:
        """Give slots back: one ZREM each, in the next pipeline flush with the decisions
        of the same event-loop iteration (Cluster: one after the other)."""
        try:
            if self.pipeline:
                await asyncio.gather(*[self._queue_release(lease) for lease in leases])
            else:
                for lease in leases:
                    await self._client.zrem(
                        redis_key(self.prefix, lease.key, lease.scope, lease.uid), lease.id)
        except _FAILURES as exc:
            msg = f"redis could not release {len(leases)} slot(s): {exc}"
            raise StorageError(msg) from exc

    async def usage(
        self, key: str, granularity: Granularity, start: float, end: float,
    ) -> list[tuple[int, int]]:
        try:
            seconds, micros = await self._client.time()
            now = seconds + micros / 1_000_000 if self._clock is None else self._clock()
            buckets = bucket_range(granularity, start, end, now, self.retention)
            if not buckets:
                return []
            tag = f"{identity_tag(self.prefix, key)}u:{granularity[0]}:"
            counts = await self._client.mget([f"{tag}{n}" for n in buckets])
        except _FAILURES as exc:
            msg = f"redis could not read the usage of {key!r}: {exc}"
            raise StorageError(msg) from exc
        size = BUCKET_SECONDS[granularity]
        return [(n * size, int(count or 0)) for n, count in zip(buckets, counts, strict=True)]

    async def reset(self, key: str) -> None:
        pattern = _glob_escape(identity_tag(self.prefix, key)) + "*"
        try:
            batch: list[Any] = []
            async for name in self._client.scan_iter(match=pattern, count=500):
                batch.append(name)
                if len(batch) >= 500:
                    await self._client.unlink(*batch)
                    batch.clear()
            if batch:
                await self._client.unlink(*batch)
        except _FAILURES as exc:
            msg = f"redis could not reset {key!r}: {exc}"
            raise StorageError(msg) from exc

    async def ping(self) -> bool:
        try:
            return bool(await self._client.ping())
        except _FAILURES:
            return False

    async def close(self) -> None:
        """Stop the batches still in flight (a batch whose callers gave up may run on
        for its grace period), then close the client if it is ours."""
        flushes = list(self._flushes)
        for task in flushes:
            task.cancel()
        if flushes:
            await asyncio.gather(*flushes, return_exceptions=True)
        if self._owns_client:
            await self._client.aclose()


class _Expiry:
    """Fails the futures of a batch whose callers' deadlines pass, one timer at a time
    (the earliest deadline still waited for)."""

    __slots__ = ("_batch", "_handle", "_loop")

    def __init__(self, loop: asyncio.AbstractEventLoop, batch: list[_Queued]) -> None:
        self._loop = loop
        self._batch = batch
        self._handle: asyncio.TimerHandle | None = None
        self._arm()

    def _arm(self) -> None:
        waiting = [deadline for _, _, future, deadline, _ in self._batch
                   if not future.done() and deadline != math.inf]
        self._handle = self._loop.call_at(min(waiting), self._fire) if waiting else None

    def _fire(self) -> None:
        now = self._loop.time()
        for _, _, future, deadline, _ in self._batch:
            if deadline <= now and not future.done():
                future.set_exception(TimeoutError("redis did not answer within the timeout"))
        self._arm()

    def cancel(self) -> None:
        if self._handle is not None:
            self._handle.cancel()


def _retrieve(future: asyncio.Future[Any]) -> None:
    """Mark a fire-and-forget command's error as seen (its slot frees with its lease)."""
    if not future.cancelled():
        future.exception()


def _glob_escape(text: str) -> str:
    """Escape the characters that SCAN MATCH treats as a pattern."""
    return "".join(f"\\{c}" if c in "*?[]\\" else c for c in text)



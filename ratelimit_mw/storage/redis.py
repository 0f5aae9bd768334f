"""Redis storage: one FCALL per request, decided on the Redis server's clock."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any, ClassVar

from mypy_extensions import mypyc_attr
from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster
from redis.commands.core import AsyncScript

from ..decision import Adjustment, Hold, Lease, Verdict
from ..errors import ConfigError, StorageError
from ..hits import Hit, merge_hits
from .base import (
    Granularity,
    Storage,
    UsageRetention,
)
from .eviction import warn_if_evicting
from .faults import CONNECTION_LOST, REDIS_FAILURES, cause
from .functions import FunctionCall, server_lacks_functions, too_old
from .inflight import DECIDE, RELEASE, SETTLE, Kind, Queued, Reported, TakenSlots, mark_seen
from .keys import check_prefix, identity_tag, redis_key
from .lease_ids import new_lease_id
from .packer import Packer
from .pipe import Pipeline
from .pool import answer_within
from .renewals import renew_leases
from .scripts import decide_library, decide_script_source, renew_script_source, settle_script_source
from .settlements import settle_adjustments
from .standalone import client_from_url, forget_identity
from .usage_reads import read_usage
from .warmup import WARM_CONNECTIONS, probe_commands, warm_client, warm_cluster, warm_pipeline
from .wire import (
    hit_arg,
    pack_function_load,
    pack_script_load,
    slots_taken,
    spends_arg,
    verdict_from,
)

__all__ = ["RedisStorage", "decide_script_source"]

@mypyc_attr(allow_interpreted_subclasses=True)
class RedisStorage(Storage):
    """Counters in Redis, shared by every process that uses the same server.

    Each decision is one ``FCALL`` (its library reloaded when missing), whatever the number
    of limits; time comes from Redis's ``TIME``, so app servers with skewed clocks
    agree. All keys of one identity share a hash slot, so it runs on Redis Cluster.
    Errors are raised as ``StorageError``; what to do then is the caller's policy.
    """

    __slots__ = ("_client", "_clock", "_cold", "_decide", "_owns_client", "_packer", "_pipeline",
                 "_renew_script", "_settle_script", "_socket_timeout", "connect_timeout",
                 "pipeline", "prefix", "retention", "timeout")

    def __init__(
        self,
        client: Redis | Any,
        *,
        prefix: str = "ratelimit:",
        owns_client: bool = False,
        usage_retention: UsageRetention = UsageRetention(),  # noqa: B008 - immutable
        pipeline: bool | None = None,
        timeout: float | None = None,
        connect_timeout: float | None = None,
    ) -> None:
        self.prefix = check_prefix(prefix)
        # Seconds within which each pipelined batch must be answered (None: only the
        # client's socket timeout bounds it); a caller may ask for less (decide_within).
        self.timeout = timeout
        # Seconds a decision may wait instead while a connection is being made (at
        # first, after one was lost): a connection set up is not a slow storage.
        self.connect_timeout = connect_timeout
        self._cold = True  # no decision answered since the start or a lost connection
        # Decisions asked for in the same event-loop tick go out as one pipeline: one
        # write and one read for many requests. Plain Redis only (Cluster routes per key).
        self.pipeline = isinstance(client, Redis) if pipeline is None else pipeline
        if self.pipeline and not isinstance(client, Redis):
            msg = (f"pipeline=True needs a redis.asyncio.Redis client, not "
                   f"{type(client).__name__}; leave pipeline unset for Redis Cluster")
            raise ConfigError(msg)
        self.retention = UsageRetention(*usage_retention).check()
        kwargs = getattr(getattr(client, "connection_pool", None), "connection_kwargs", {})
        socket_timeout = kwargs.get("socket_timeout") if self.pipeline else None
        self._socket_timeout: float | None = (
            float(socket_timeout) if isinstance(socket_timeout, int | float) else None)
        self._client = client
        self._owns_client = owns_client
        # Set by the tests alone: a clock (epoch seconds) that decides instead of Redis's
        # TIME, so that memory and Redis can run on one simulated time.
        self._clock: Callable[[], float] | None = None
        library = decide_library()
        self._decide = FunctionCall(client, library)
        self._renew_script: AsyncScript = client.register_script(renew_script_source())
        settle_script = settle_script_source()
        self._settle_script: AsyncScript = client.register_script(settle_script)
        # Pipelined decisions, give-backs and settlements share one connection of their own.
        self._pipeline = Pipeline(
            client, (pack_function_load(library.source), pack_script_load(settle_script)),
            self._abandon) if self.pipeline else None
        # Keys packed by hand are encoded as redis-py would (the client's encoding).
        self._packer = Packer(
            self.prefix, library.function, self._settle_script.sha, self.retention,
            client.get_encoder().encode if self.pipeline else str.encode)

    @classmethod
    def from_url(
        cls, url: str, *, prefix: str = "ratelimit:", timeout: float | None = None,
        usage_retention: UsageRetention = UsageRetention(),  # noqa: B008 - immutable
        connect_timeout: float | None = None, **options: Any,
    ) -> RedisStorage:
        """Connect lazily to ``redis://`` or ``rediss://``; ``timeout`` bounds each call,
        ``connect_timeout`` (default: ``timeout``) the set-up of a connection, which
        decisions arriving meanwhile wait for.

        Callers beyond ``max_connections`` (default 100) wait for a free connection
        (up to ``pool_timeout`` seconds, default 5) instead of failing. Other options
        go to redis-py.
        """
        client = client_from_url(url, timeout, connect_timeout, **options)
        return cls(client, prefix=prefix, owns_client=True, usage_retention=usage_retention,
                   timeout=timeout, connect_timeout=connect_timeout)

    @property
    def client(self) -> Redis:
        """The underlying ``redis.asyncio`` client."""
        return self._client

    def __repr__(self) -> str:
        return f"RedisStorage(prefix={self.prefix!r}, client={self._client!r})"

    async def decide(self, key: str, hits: Sequence[Hit], *, usage: int = 0) -> Verdict:
        return await RedisStorage.decide_within(self, None, key, hits, usage=usage)

    async def decide_within(
        self, timeout: float | None, key: str, hits: Sequence[Hit], *, usage: int = 0,
    ) -> Verdict:
        """See ``Storage.decide_within``: a decision not answered within ``timeout``
        seconds (or the storage's own timeout, if shorter) raises ``StorageError``;
        decisions pipelined together share one timer."""
        hits = merge_hits(hits)
        if not hits and not usage:
            return Verdict(True, ())
        clock = self._clock_arg()
        wait = self._bound(timeout)
        if self._cold or (self._pipeline is not None and not self._pipeline.connected):
            wait = self._connecting_wait(wait)
        try:
            if self.pipeline:
                command, slots, lease_id = self._packer.decision(key, hits, usage, clock.encode())
                reply = await self._queue(DECIDE, command, wait,
                                          (key, slots, lease_id) if slots else None)
            else:
                tag = identity_tag(self.prefix, key)
                spec = self._packer.usage_arg(usage).decode() + spends_arg(hits) if usage else ""
                slots = slots_taken(hits)
                lease_id = new_lease_id() if slots else ""
                keys = [redis_key(self.prefix, key, hit.scope, hit.limit.uid) for hit in hits]
                if usage and not keys:
                    keys.append(f"{tag}u:")  # a key to route by (see decide.lua)
                args = [clock, lease_id, spec, *map(hit_arg, hits)]
                reply = await answer_within(self._decide(keys=keys, args=args), wait)
        except REDIS_FAILURES as exc:
            if isinstance(exc, CONNECTION_LOST):
                self._cold = True
            msg = f"redis could not decide for {len(hits)} limit(s): {cause(exc)}"
            raise StorageError(msg) from exc
        self._cold = False
        try:
            return verdict_from(key, hits, lease_id, slots, reply)
        except (TypeError, ValueError, IndexError, KeyError) as exc:
            msg = f"redis answered a decision with {str(reply)[:100]}, not a decision"
            raise StorageError(msg) from exc

    def _clock_arg(self) -> str:
        """The scripts' clock argument: empty (Redis's own clock), or the test clock's
        time in microseconds."""
        return "" if self._clock is None else str(round(self._clock() * 1_000_000))

    def _clock_bytes(self) -> bytes:
        return self._clock_arg().encode()

    def _connecting_wait(self, wait: float | None) -> float | None:
        """What a decision may wait while a connection is being made: the connect
        timeout, if longer than ``wait``."""
        connect = self.connect_timeout
        if connect is None or wait is None:
            return wait
        return connect if connect > wait else wait

    def _bound(self, timeout: float | None) -> float | None:
        """The time a call may take: the shorter of ``timeout`` and the storage's own."""
        if self.timeout is None:
            return timeout
        return self.timeout if timeout is None else min(timeout, self.timeout)

    def _queue(self, kind: Kind, command: bytes, wait: float | None = None,
               slots: TakenSlots | None = None) -> asyncio.Future[Any]:
        """Queue one command for the next flush (queued at once, so a caller cancelled
        right after still has its command sent); the future of its reply."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        self._pipeline.put(  # type: ignore[union-attr]
            self._entry(kind, command, future, wait, slots, loop), loop)
        return future

    def _entry(self, kind: Kind, command: bytes, reply: asyncio.Future[Any] | Reported,
               wait: float | None, slots: TakenSlots | None,
               loop: asyncio.AbstractEventLoop) -> Queued:
        """A command for the pipeline. Its caller waits at most ``wait`` seconds, else the
        client's socket timeout (a release at least 1 s, as a slot not given back stays
        taken for its whole lease)."""
        if wait is None:  # the pipe reads without redis-py, so its socket timeout is ours
            wait = self._socket_timeout
        if kind.closes and wait is not None:
            wait = max(1.0, wait)
        return kind, command, reply, math.inf if wait is None else loop.time() + wait, slots

    def _abandon(self, slots: TakenSlots) -> None:
        """Give back the slots of an admitted decision whose caller had given up."""
        key, taken, lease_id = slots
        for scope, uid in taken:
            self._queue_release(Lease(key, scope, uid, lease_id)).add_done_callback(mark_seen)

    def _queue_release(self, lease: Lease) -> asyncio.Future[Any]:
        """The ZREM that gives ``lease``'s slot back, queued for the next flush."""
        return self._queue(RELEASE, self._packer.release(lease), self._bound(None))

    def _queue_releases(self, leases: Sequence[Lease]) -> asyncio.Future[Any]:
        """The ZREMs of ``leases``, queued; done when all are answered (one future for
        one lease, the common case, rather than a gathering of one)."""
        if len(leases) == 1:
            return self._queue_release(leases[0])
        return asyncio.gather(*[self._queue_release(lease) for lease in leases])

    async def renew(self, leases: Sequence[Lease], period_us: int) -> None:
        """See ``Storage.renew``: one script call per identity (whose keys share a hash
        slot, so it works on Cluster), on Redis's clock, a few at a time (a burst of
        new connections would time out), each bounded like any call by the client's
        socket timeout; the caller bounds the whole (the middleware: by its renewals'
        tick). Each identity's renewal stands on its own: the error counts the slots
        whose renewal failed."""
        await renew_leases(self._renew_script, self.prefix, self._clock_arg(), leases,
                           period_us)

    async def release(self, leases: Sequence[Lease]) -> None:
        """Give slots back: one ZREM each, in the next pipeline flush with the decisions
        of the same event-loop iteration (Cluster: one after the other)."""
        try:
            if self.pipeline:
                await self._queue_releases(leases)
            else:
                async with asyncio.timeout(self._bound(None)):
                    for lease in leases:
                        await self._client.zrem(
                            redis_key(self.prefix, lease.key, lease.scope, lease.uid),
                            lease.id)
        except REDIS_FAILURES as exc:
            msg = f"redis could not release {len(leases)} slot(s): {cause(exc)}"
            raise StorageError(msg) from exc

    def release_now(
        self, leases: Sequence[Lease],
        on_failure: Callable[[Sequence[Lease], BaseException], None],
    ) -> bool:
        """See ``Storage.release_now``: on pipelined Redis with a timeout, the ZREMs are
        written at once, before the caller goes on (to send the end of its response),
        and ahead of every decision this storage makes later (one connection, in
        order); a failure reaches ``on_failure`` when Redis answers or the timeout
        passes (the slots then free themselves when their lease ends)."""
        pipeline = self._pipeline
        if pipeline is None or self.timeout is None:
            return False
        loop = asyncio.get_running_loop()
        wait = self._bound(None)
        pipeline.write_now([
            self._entry(RELEASE, self._packer.release(lease),
                        Reported(on_failure, leases if len(leases) == 1 else (lease,)),
                        wait, None, loop) for lease in leases], loop)
        return True

    settles: ClassVar[bool] = True

    async def settle(self, adjustments: Sequence[Adjustment]) -> None:
        """See ``Storage.settle``: one settle.lua call per identity (Cluster: its keys
        share a hash slot), on Redis's clock; the decision's time says which window, log
        entry or bucket the reservation went to. Pipelined: in the next flush."""
        try:
            if self._pipeline is not None:
                await self._queue_settlements(adjustments)
            else:
                await settle_adjustments(self._settle_script, self.prefix,
                                         self._clock_arg(), adjustments)
        except REDIS_FAILURES as exc:
            msg = f"redis could not settle {len(adjustments)} charge(s): {cause(exc)}"
            raise StorageError(msg) from exc

    def settle_now(
        self, adjustments: Sequence[Adjustment],
        on_failure: Callable[[Sequence[Hold], BaseException], None],
    ) -> bool:
        """See ``Storage.settle_now``: on pipelined Redis the settlements are written at
        once, before the response's end goes out, and ahead of every decision this
        storage makes later (one connection, in order): the caller's next request
        finds them made."""
        pipeline = self._pipeline
        if pipeline is None:
            return False
        loop = asyncio.get_running_loop()
        wait = self._bound(None)
        pipeline.write_now([
            self._entry(SETTLE, command, Reported(on_failure, group), wait, None, loop)
            for group, command in self._packer.settlements(adjustments, self._clock_bytes())], loop)
        return True

    def _queue_settlements(self, adjustments: Sequence[Adjustment]) -> asyncio.Future[Any]:
        """The settle.lua calls of ``adjustments``, queued; done when all are answered."""
        wait = self._bound(None)
        commands = self._packer.settlements(adjustments, self._clock_bytes())
        if len(commands) == 1:
            return self._queue(SETTLE, commands[0][1], wait)
        return asyncio.gather(*[self._queue(SETTLE, command, wait) for _, command in commands])

    async def usage(
        self, key: str, granularity: Granularity, start: float, end: float,
        unit: str = "requests",
    ) -> list[tuple[int, int]]:
        return await read_usage(self._client, self.prefix, self.retention, self._clock,
                                self._bound(None), key, granularity, start, end, unit)

    async def reset(self, key: str) -> None:
        await forget_identity(self._client, self.prefix, key)

    async def ping(self) -> bool:
        try:
            return bool(await self._client.ping())
        except REDIS_FAILURES:
            return False

    async def prepare(self) -> None:
        """See ``Storage.prepare``: connect (Cluster: learn the slot map and every
        primary), load the scripts, run each command the library uses once in a form
        that changes nothing (a missing ACL permission shows now), open connections,
        and warn if Redis may evict our keys (``eviction``); a failure raises
        ``StorageError`` from its cause."""
        library = self._decide.library.source
        scripts = [renew_script_source(), settle_script_source()]
        probes = probe_commands(self._decide.library.function, self._settle_script.sha,
                                f"{identity_tag(self.prefix, '')}probe")
        try:
            if isinstance(self._client, RedisCluster):
                await warm_cluster(self._client, library, scripts, probes, WARM_CONNECTIONS)
            elif self._pipeline is not None:
                # The pipelined connection carries the decisions: set it up through it.
                await warm_pipeline(partial(self._queue, DECIDE, wait=math.inf), library,
                                    scripts, probes)
            else:
                await warm_client(self._client, library, scripts, probes, WARM_CONNECTIONS)
        except REDIS_FAILURES as exc:
            if server_lacks_functions(exc):
                exc = too_old(exc)
            msg = f"redis is not ready: {cause(exc)}"
            raise StorageError(msg) from exc
        self._cold = False
        await warn_if_evicting(self._client)

    async def close(self) -> None:
        """Close the pipelined connection (callers still waiting on it are cancelled),
        then the client if it is ours."""
        if self._pipeline is not None:
            await self._pipeline.close()
        if self._owns_client:
            await self._client.aclose()


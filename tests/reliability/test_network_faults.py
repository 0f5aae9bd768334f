"""Faults of the network between the app and Redis, made by a proxy (``faults_proxy``):
latency on the link, a link that holds (both sockets open, nothing forwarded), and a
connection reset in the middle of a reply.

What holds through each: decisions are answered within ``storage_timeout`` plus
``MARGIN`` (by Redis, or by the failure policy; 99 in 100, and every one within
``PAUSE`` more); no more than ``max_pending_decisions``
decisions wait on the storage at once, past which the failure policy answers at once;
Redis decides again within a second of the fault clearing (the breaker's
``recovery_interval`` of 0.5 s, then a trial call); the metrics count the failures by
kind.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest

from ratelimit_mw import RedisStorage, Tier
from ratelimit_mw.middleware import RateLimitMiddleware
from tests.conftest import middleware_arguments
from tests.faults_proxy import ProxyProcess, fault_proxy
from tests.redis_servers import own_redis
from tests.reliability.kinds import ErrorKinds, hello_app

pytestmark = [pytest.mark.reliability, pytest.mark.redis]

STORAGE_TIMEOUT = 0.25
"""Above the round trips of a loaded 2-core machine, which reach 70 ms now and then
even without a proxy."""
MARGIN = 0.05
"""What 99 requests in 100 take beyond ``storage_timeout`` (the app, its client)."""
PAUSE = 0.5
"""What the slowest may take more: the app and its in-process client share one
process (its collector) on a loaded 2-core machine."""
RECOVERY_S = 1.0
CALLERS = 10


@dataclass
class Run:
    """The app behind the proxy, and what its requests met."""

    proxy: ProxyProcess
    middleware: Any
    client: httpx.AsyncClient
    metrics: ErrorKinds
    waits: list[tuple[float, bool]] = field(default_factory=list)
    """(seconds, decided by Redis) of each request of the load."""
    most_pending: int = 0

    @property
    def stats(self) -> Any:
        return self.middleware.failure_stats

    async def load(self, seconds: float, callers: int = CALLERS) -> list[tuple[float, bool]]:
        """``callers`` clients, each sending one request after the other; their waits."""
        deadline = time.monotonic() + seconds
        waits: list[tuple[float, bool]] = []

        async def caller(n: int) -> None:
            while time.monotonic() < deadline:
                waits.append(await self.request(f"198.51.100.{n}"))
                # A request the failure policy answers never suspends in process (no
                # socket): yield, or this caller would keep the loop to itself.
                await asyncio.sleep(0)

        await asyncio.gather(*(caller(n) for n in range(callers)))
        self.waits += waits
        return waits

    async def request(self, ip: str) -> tuple[float, bool]:
        started = time.monotonic()
        reply = await self.client.get("/", headers={"x-forwarded-for": ip})
        assert reply.status_code == 200, reply.text  # open: never a 500, never refused
        self.most_pending = max(self.most_pending, self.middleware.limiter.guarded.pending)
        return time.monotonic() - started, "x-ratelimit-remaining" in reply.headers

    async def until_redis_decides(self) -> float:
        """Seconds until Redis decides 10 requests in a row again."""
        started = time.monotonic()
        streak = 0
        while streak < 10:
            if time.monotonic() - started > 5:
                pytest.fail(f"Redis did not decide again within 5 s; {self.stats}")
            streak = streak + 1 if (await self.request("198.51.100.200"))[1] else 0
            await asyncio.sleep(0 if streak else 0.01)
        return time.monotonic() - started


@contextmanager
def _redis_behind_proxy() -> Iterator[ProxyProcess]:
    with own_redis() as redis, fault_proxy("127.0.0.1", redis.port) as proxy:
        yield proxy


@asynccontextmanager
async def _running(proxy: ProxyProcess, **settings: Any) -> AsyncIterator[Run]:
    """The app on a storage that reaches Redis through ``proxy``, warmed up."""
    storage = RedisStorage.from_url(proxy.url, timeout=STORAGE_TIMEOUT,
                                    prefix=f"rlnet:{uuid.uuid4().hex[:8]}:")
    metrics = ErrorKinds()
    middleware = RateLimitMiddleware(
        hello_app(), metrics=metrics, **middleware_arguments(
            tiers=[Tier("default", "1000000/minute")], storage=storage,
            failure_mode="open", storage_timeout=STORAGE_TIMEOUT, recovery_interval=0.5,
            trusted_proxies=["127.0.0.1"], **settings))
    transport = httpx.ASGITransport(app=middleware, client=("127.0.0.1", 1))
    try:
        await storage.prepare()
        async with httpx.AsyncClient(transport=transport, base_url="http://t",
                                     timeout=10) as client:
            run = Run(proxy, middleware, client, metrics)
            # Warm until a whole round is decided by Redis: on a loaded host one decision
            # of the first may pass the timeout and open the breaker for 0.5 s.
            for _ in range(8):
                warm = await run.load(0.3)
                if all(decided for _, decided in warm):
                    break
            assert all(decided for _, decided in warm)
            run.waits.clear()
            yield run
    finally:
        proxy.clear()
        await storage.close()


def _answered_in_time(waits: list[tuple[float, bool]], extra: float = 0.0) -> bool:
    """99 in 100 of ``waits`` within the timeout and the margin, all within ``PAUSE`` more."""
    seconds = sorted(wait for wait, _ in waits)
    limit = STORAGE_TIMEOUT + MARGIN + extra
    return seconds[len(seconds) * 99 // 100] < limit and seconds[-1] < limit + PAUSE


def _by_redis(waits: list[tuple[float, bool]]) -> float:
    """The share of ``waits`` Redis decided."""
    return sum(decided for _, decided in waits) / len(waits)


@pytest.mark.parametrize(("latency", "decided"), [(0.005, True), (0.05, True),
                                                  (0.5, False)])
async def test_latency_on_the_link(latency: float, decided: bool) -> None:
    """5 and 50 ms more per round trip: Redis still decides. 500 ms: the
    failure policy answers each within the timeout, the timeouts are counted, and Redis
    decides again within a second of the latency going away."""
    with _redis_behind_proxy() as proxy:
        async with _running(proxy) as run:
            proxy.latency = latency
            waits = await run.load(1.5)
            proxy.clear()
            back = await run.until_redis_decides()
    assert len(waits) > 50
    assert _answered_in_time(waits, latency if decided else 0)
    if decided:
        # Calls time out only when the machine stalls (a batch of CALLERS at a time,
        # then the breaker rests): not one call in ten, as a slow link would make.
        assert run.stats.failures <= 2 * CALLERS, run.stats
        assert _by_redis(waits) > 0.5, run.stats
    else:
        assert not any(by_redis for _, by_redis in waits[CALLERS:])
        assert run.stats.timeouts >= 3 and run.metrics.kinds["timeout"] == run.stats.timeouts
        assert run.stats.skipped > 0  # the breaker spared the rest the wait
    assert back < RECOVERY_S


async def test_a_held_link() -> None:
    """A link that forwards nothing for 3 s while both sockets stay open: every request
    answered within the timeout, the waiting decisions stay few (the breaker opens),
    and Redis decides again within a second of the link forwarding again."""
    with _redis_behind_proxy() as proxy:
        async with _running(proxy) as run:
            proxy.hold()
            first = await run.load(1.5)
            second = await run.load(1.5)
            proxy.clear()
            back = await run.until_redis_decides()
    assert len(first) > 50 and len(second) > 50
    assert _answered_in_time(first + second)
    assert not any(by_redis for _, by_redis in first[CALLERS:] + second)
    assert run.most_pending <= CALLERS  # flat: no pile-up behind the held link
    assert run.stats.timeouts >= 3 and run.metrics.kinds["timeout"] == run.stats.timeouts
    assert run.stats.skipped > len(second) / 2
    assert back < RECOVERY_S


async def test_a_burst_on_a_held_link_waits_no_more_than_max_pending() -> None:
    """300 requests at once on a held link, with max_pending_decisions=50: 50 wait for
    the timeout, the other 250 are answered at once by the failure policy and counted
    as overloaded. (Their waits, seen from the client, are its own: 300 requests
    served in one process.)"""
    with _redis_behind_proxy() as proxy:
        async with _running(proxy, max_pending_decisions=50) as run:
            proxy.hold()
            waits = await asyncio.gather(*(run.request(f"203.0.113.{i % 250}")
                                           for i in range(300)))
            proxy.clear()
            back = await run.until_redis_decides()
    assert run.most_pending <= 50
    assert run.stats.overloaded >= 250 - CALLERS
    assert run.metrics.kinds["overloaded"] == run.stats.overloaded
    assert not any(by_redis for _, by_redis in waits)
    assert back < RECOVERY_S


async def test_a_reset_in_the_middle_of_a_reply() -> None:
    """Connections reset while a reply is half sent, three times under load: the
    requests caught are answered by the failure policy without waiting out the
    timeout, counted as storage errors, and Redis decides again within a second."""
    with _redis_behind_proxy() as proxy:
        async with _running(proxy) as run:
            loading = asyncio.ensure_future(run.load(2.0))
            for _ in range(3):
                await asyncio.sleep(0.5)
                proxy.reset_mid_reply()
            waits = await loading
            back = await run.until_redis_decides()
            resets = proxy.resets
    assert resets >= 3
    assert _answered_in_time(waits)
    assert run.stats.connection_errors >= 1
    assert run.metrics.kinds["storage"] == run.stats.connection_errors
    assert sum(by_redis for _, by_redis in waits) > 100  # between the resets
    assert back < RECOVERY_S

"""What Sentinel adds: decisions on the primary it names, and a failover survived.

The storage-matrix cases run on Sentinel too (test_storage_matrix.py).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import pytest

from ratelimit_mw import Hit, Limit, RedisStorage, StorageError
from ratelimit_mw.decision import Verdict
from tests.redis_servers import SentinelDeployment, StorageFactory, storage_factory

# The session's deployment takes seconds to start: not in the quick loop.
pytestmark = pytest.mark.slow


@pytest.fixture
async def make(redis_sentinel_url: str) -> AsyncIterator[StorageFactory]:
    async with storage_factory(redis_sentinel_url) as factory:
        yield factory


async def test_decides_on_the_primary_and_replicates(
    make: StorageFactory, redis_sentinel: SentinelDeployment,
) -> None:
    """The counters live on the primary Sentinel names, and reach the replica."""
    storage = make()
    assert isinstance(storage, RedisStorage)
    assert (await storage.decide("sam", [Hit(Limit("5/minute"))])).allowed
    primary = redis_sentinel.current_primary()
    replica = next(node for node in redis_sentinel.data_nodes if node is not primary)
    assert primary.call("KEYS", storage.prefix + "*")
    assert primary.call("WAIT", 1, 2000) == 1
    assert replica.call("KEYS", storage.prefix + "*") == primary.call("KEYS", storage.prefix + "*")


async def test_an_unknown_service_is_a_storage_error(redis_sentinel_url: str) -> None:
    """Sentinels that know no such service: StorageError, and ping is False."""
    async with storage_factory(redis_sentinel_url.rsplit("/", 1)[0] + "/nosuch") as factory:
        storage = factory(timeout=0.5)
        with pytest.raises(StorageError, match="nosuch"):
            await storage.decide("x", [Hit(Limit("1/second"))])
        assert not await storage.ping()


@pytest.mark.slow
async def test_limits_survive_a_failover(
    make: StorageFactory, redis_sentinel: SentinelDeployment,
) -> None:
    """The primary killed: StorageError (nothing else) until the replica is promoted,
    within seconds, then the same counters go on, exactly."""
    redis_sentinel.wait_until_ready()
    storage = make(timeout=0.5)
    hit = Hit(Limit("1000/hour", "sliding_window"))
    for _ in range(10):
        assert (await storage.decide("fay", [hit])).allowed
    old = redis_sentinel.current_primary()
    assert old.call("WAIT", 1, 2000) == 1  # the replica has every count so far
    old.kill()
    try:
        started = time.monotonic()
        admitted, failed = 0, 0
        while admitted < 5:
            assert time.monotonic() - started < 20, f"no failover after {failed} errors"
            try:
                verdict: Verdict = await storage.decide("fay", [hit])
            except StorageError:
                failed += 1
                await asyncio.sleep(0.1)
                continue
            admitted += verdict.allowed
        new = redis_sentinel.current_primary()
        assert new is not old
        assert failed > 0  # the outage was seen, as StorageError
        assert (await storage.peek("fay", [hit])).decisions[0].remaining == 1000 - 15
    finally:
        old.start()  # it comes back empty, and Sentinel makes it the new primary's replica


async def test_a_full_pool_queues_instead_of_failing(make: StorageFactory) -> None:
    """With max_connections, batches in flight at once wait for a connection instead of
    failing: every decision is answered, and counted exactly."""
    storage = make(max_connections=1, timeout=2.0)
    hit = Hit(Limit("50/hour", "fixed_window"))

    async def later(i: int) -> Verdict:
        for _ in range(i % 7):  # spread over several event-loop ticks: several batches
            await asyncio.sleep(0)
        return await storage.decide("queued", [hit])

    verdicts = await asyncio.gather(*(later(i) for i in range(80)))
    assert sum(v.allowed for v in verdicts) == 50


@pytest.mark.parametrize("kind", ["redis", "sentinel"])
async def test_calls_beyond_the_default_pool_wait_their_turn(
    kind: str, redis_url: str, request: pytest.FixtureRequest,
) -> None:
    """Without max_connections, the calls that go by the pool (usage reads: the quota
    endpoints) beyond its 100 connections wait for one, as on Cluster; they failed at
    once with 'Too many connections'."""
    url = redis_url if kind == "redis" else request.getfixturevalue("redis_sentinel_url")
    async with storage_factory(url) as factory:
        storage = factory(timeout=5.0)
        assert isinstance(storage, RedisStorage)
        results = await asyncio.gather(
            *(storage.usage(f"caller-{i % 3}", "day", time.time() - 60, time.time())
              for i in range(300)), return_exceptions=True)
    assert [r for r in results if isinstance(r, BaseException)] == []

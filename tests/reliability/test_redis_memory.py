"""Redis out of memory: an evicting policy is named at start-up, and a full Redis's
``OOM`` replies are answered by the failure policy and counted under their own cause.

Each test runs on a redis-server of its own with a small ``maxmemory``.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from typing import Any

import httpx
import pytest

from ratelimit_mw import RedisStorage, Tier
from ratelimit_mw.middleware import RateLimitMiddleware
from ratelimit_mw.storage.eviction import eviction_risk
from tests.conftest import middleware_arguments
from tests.redis_servers import RedisProcess, own_redis
from tests.reliability.kinds import ErrorKinds, hello_app

pytestmark = [pytest.mark.reliability, pytest.mark.redis]


@pytest.mark.parametrize(("maxmemory", "policy", "evicts"), [
    ("3145728", "allkeys-lru", "allkeys-* policies evict any key"),
    ("3145728", "allkeys-random", "allkeys-* policies evict any key"),
    ("3145728", "volatile-ttl", "so volatile-* policies evict them too"),
    ("3145728", "volatile-lfu", "so volatile-* policies evict them too"),
    ("3145728", "noeviction", None),
    ("0", "allkeys-lru", None),  # no maxmemory: nothing is evicted
])
def test_which_policies_can_evict_our_keys(maxmemory: str, policy: str,
                                           evicts: str | None) -> None:
    """Every policy but noeviction evicts our keys once maxmemory is reached."""
    risk = eviction_risk({"maxmemory": maxmemory, "maxmemory_policy": policy,
                          "maxmemory_human": "3.00M"})
    if evicts is None:
        assert risk is None
    else:
        assert risk is not None and evicts in risk
        assert f"maxmemory=3.00M with maxmemory-policy={policy}" in risk
        assert "whole quota again" in risk and "noeviction" in risk


@pytest.mark.parametrize(("policy", "warned"), [("allkeys-lru", True),
                                                ("volatile-lru", True),
                                                ("noeviction", False)])
async def test_start_up_warns_once_when_redis_may_evict(
    policy: str, warned: bool, caplog: pytest.LogCaptureFixture,
) -> None:
    """``prepare`` reads INFO memory and names an evicting policy and its consequence."""
    with own_redis() as redis:
        redis.call("CONFIG", "SET", "maxmemory", "3mb")
        redis.call("CONFIG", "SET", "maxmemory-policy", policy)
        storage = RedisStorage.from_url(f"redis://127.0.0.1:{redis.port}/0", timeout=1)
        try:
            with caplog.at_level(logging.WARNING, logger="ratelimit_mw"):
                await storage.prepare()
        finally:
            await storage.close()
    lines = [r.getMessage() for r in caplog.records if "maxmemory" in r.getMessage()]
    if warned:
        assert len(lines) == 1, lines
        assert f"maxmemory-policy={policy}" in lines[0] and "maxmemory=3" in lines[0]
    else:
        assert lines == []


def _fill(redis: RedisProcess) -> None:
    """Fill Redis past its maxmemory: 2 MB of data, then a maxmemory of 1 MB below it
    (under noeviction, every write is then refused with OOM)."""
    client = redis.client()
    try:
        client.mset({f"filler:{i}": "x" * 10_000 for i in range(200)})
        client.config_set("maxmemory", "1mb")
    finally:
        client.close()


@pytest.mark.parametrize(("mode", "status"), [("open", 200), ("closed", 503)])
async def test_a_full_redis_is_answered_by_the_failure_policy_and_counted_as_oom(
    mode: str, status: int, caplog: pytest.LogCaptureFixture,
) -> None:
    """Under noeviction a full Redis answers each decision's script with OOM: the
    failure policy answers, ``oom_errors`` and the ``oom`` kind count them, and Redis
    decides again once it has room."""
    metrics = ErrorKinds()
    with own_redis() as redis:
        redis.call("CONFIG", "SET", "maxmemory-policy", "noeviction")
        storage = RedisStorage.from_url(f"redis://127.0.0.1:{redis.port}/0", timeout=1,
                                        prefix=f"rloom:{uuid.uuid4().hex[:8]}:")
        middleware: Any = None

        def app() -> Any:
            nonlocal middleware
            middleware = RateLimitMiddleware(
                hello_app(), metrics=metrics,
                **middleware_arguments(tiers=[Tier("default", "1000/minute")],
                                       storage=storage, failure_mode=mode,
                                       storage_timeout=0.5, recovery_interval=0.2))
            return middleware

        transport = httpx.ASGITransport(app=app(), client=("198.51.100.9", 1))
        try:
            async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
                assert (await client.get("/")).headers["x-ratelimit-remaining"] == "999"
                _fill(redis)
                full = [await client.get("/") for _ in range(10)]
                redis.call("CONFIG", "SET", "maxmemory", "0")  # room again
                for _ in range(50):  # the breaker's cooldown, then a trial call
                    back = await client.get("/")
                    if "x-ratelimit-remaining" in back.headers:
                        break
                    await asyncio.sleep(0.05)
        finally:
            await storage.close()
    assert [reply.status_code for reply in full] == [status] * 10
    assert all("x-ratelimit-remaining" not in reply.headers for reply in full)
    stats = middleware.failure_stats
    assert stats.oom_errors >= 1 and stats.oom_errors == stats.failures
    assert stats.without_storage >= 10 and stats.episodes == 1  # and until the breaker tried
    assert metrics.kinds["oom"] == stats.oom_errors and set(metrics.kinds) == {"oom"}
    assert back.status_code == 200 and "x-ratelimit-remaining" in back.headers
    assert "oom=" in caplog.text and "command not allowed when used memory" in caplog.text

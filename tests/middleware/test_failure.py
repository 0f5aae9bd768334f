"""Failure policy with a real Redis that is stopped and restarted in the middle of a test."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import pytest

from ratelimit_mw import RedisStorage
from ratelimit_mw.events import DecisionEvent
from ratelimit_mw.tiers import Tier

from .conftest import RedisServer, client_for, make_app

pytestmark = pytest.mark.redis

AppFactory = Callable[[str, list[DecisionEvent]], Any]


@pytest.fixture
async def app_on(redis_server: RedisServer) -> AsyncIterator[AppFactory]:
    """Build apps deciding on the test's own Redis, in a failure mode; storages closed after."""
    storages: list[RedisStorage] = []

    def factory(mode: str, events: list[DecisionEvent]) -> Any:
        storage = RedisStorage.from_url(redis_server.url, prefix="mw-failure:", timeout=0.05)
        storages.append(storage)
        return make_app(tiers=[Tier("t", "2/minute")], storage=storage, failure_mode=mode,
                        storage_timeout=0.05, recovery_interval=0.3, on_decision=events.append)

    yield factory
    for storage in storages:
        await storage.close()


async def _until_storage_answers(client: httpx.AsyncClient, events: list[DecisionEvent]) -> float:
    """Request until a decision comes from Redis again; the seconds that took."""
    start = time.monotonic()
    while time.monotonic() - start < 5:
        response = await client.get("/", headers={"x-client": str(time.monotonic())})
        assert response.status_code != 500
        if events[-1].source == "storage":
            return time.monotonic() - start
        await _pause(0.05)
    pytest.fail("the middleware did not notice that Redis came back")


async def _pause(seconds: float) -> None:
    import asyncio

    await asyncio.sleep(seconds)  # real time: the breaker's cooldown is on the real clock


async def test_fail_open_lets_requests_through_and_recovers(
    redis_server: RedisServer, app_on: AppFactory,
) -> None:
    """open: Redis down -> 200s without headers, counted; Redis back -> limits again."""
    events: list[DecisionEvent] = []
    app = app_on("open", events)
    async with client_for(app) as client:
        assert (await client.get("/")).headers["x-ratelimit-remaining"] == "1"
        redis_server.stop()
        down = [await client.get("/") for _ in range(10)]
        assert [r.status_code for r in down] == [200] * 10
        assert all("x-ratelimit-limit" not in r.headers for r in down)
        assert {e.source for e in events[1:]} == {"unavailable"}
        redis_server.start()
        assert await _until_storage_answers(client, events) < 3
        codes = [(await client.get("/")).status_code for _ in range(3)]
    assert 429 in codes


async def test_fail_closed_answers_503(redis_server: RedisServer, app_on: AppFactory) -> None:
    """closed: Redis down -> 503 with Retry-After and no-store; never a 500."""
    events: list[DecisionEvent] = []
    app = app_on("closed", events)
    async with client_for(app) as client:
        assert (await client.get("/")).status_code == 200
        redis_server.stop()
        down = [await client.get("/") for _ in range(5)]
        assert {r.status_code for r in down} == {503}
        assert all(r.headers["retry-after"].isdigit() for r in down)
        assert down[0].headers["cache-control"] == "no-store"
        assert down[0].json()["error"] == "rate_limit_unavailable"
        redis_server.start()
        await _until_storage_answers(client, events)


async def test_fail_to_memory_keeps_limiting(
    redis_server: RedisServer, app_on: AppFactory,
) -> None:
    """memory: Redis down -> a local limiter decides, so the limit still holds."""
    events: list[DecisionEvent] = []
    app = app_on("memory", events)
    async with client_for(app) as client:
        redis_server.stop()
        codes = [(await client.get("/")).status_code for _ in range(3)]
        assert codes == [200, 200, 429]
        assert events[0].source == "fallback"
        redis_server.start()
        await _until_storage_answers(client, events)


async def test_hanging_redis_does_not_cost_the_timeout_per_request(
    redis_server: RedisServer, app_on: AppFactory, caplog: pytest.LogCaptureFixture,
) -> None:
    """A frozen Redis costs a few timeouts, then the breaker answers at once; no 500."""
    events: list[DecisionEvent] = []
    app = app_on("open", events)
    async with client_for(app) as client:
        assert (await client.get("/")).status_code == 200
        assert redis_server.proc is not None
        os.kill(redis_server.proc.pid, signal.SIGSTOP)
        try:
            start = time.monotonic()
            codes = [(await client.get("/")).status_code for _ in range(40)]
            elapsed = time.monotonic() - start
        finally:
            os.kill(redis_server.proc.pid, signal.SIGCONT)
        assert set(codes) == {200}
        # 40 timeouts would take 2 s; the breaker opens after a few.
        assert elapsed < 1.0
        failures = [r for r in caplog.records if getattr(r, "ratelimit", {}).get("event")
                    == "storage_failure"]
        assert 1 <= len(failures) <= 5
        await _until_storage_answers(client, events)

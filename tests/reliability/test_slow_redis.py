"""A slow Redis (every packet held 300 ms by a proxy) costs at most the storage timeout."""

from __future__ import annotations

import asyncio
import gc
import statistics
import time
from collections import Counter
from collections.abc import Iterator

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route

from ratelimit_mw import RateLimitSettings
from ratelimit_mw.events import DecisionEvent
from ratelimit_mw.middleware import RateLimitMiddleware
from ratelimit_mw.tiers import Tier
from tests.redis_servers import RedisProcess, own_redis
from tests.reliability.servers import DelayProxy

pytestmark = [pytest.mark.reliability, pytest.mark.redis, pytest.mark.slow]

TIMEOUT = 0.1
MARGIN = 0.1
SOURCES = {"open": "unavailable", "closed": "unavailable", "memory": "fallback"}
STATUS = {"open": 200, "closed": 503, "memory": 200}


async def ok(request: Request) -> Response:
    return PlainTextResponse("ok")


@pytest.fixture(scope="module")
def redis() -> Iterator[RedisProcess]:
    """A Redis of the module's own, behind each test's proxy."""
    with own_redis() as process:
        yield process


async def _run(redis: RedisProcess, delay: float, mode: str, seconds: float,
               timeout: float = TIMEOUT,
               ) -> tuple[list[float], Counter[int], Counter[str], list[httpx.Response]]:
    """``seconds`` of 10 concurrent clients through a proxy delaying Redis by ``delay``."""
    events: list[DecisionEvent] = []
    async with DelayProxy(redis.port, delay) as proxy:
        app = RateLimitMiddleware(
            Starlette(routes=[Route("/", ok)]),
            tiers=[Tier("t", "1000000/day")],
            on_decision=events.append,
            settings=RateLimitSettings(
                storage_url=f"redis://127.0.0.1:{proxy.port}/0",
                storage_prefix="rlrel:slow:",
                storage_timeout=timeout,
                recovery_interval=0.3,
                failure_mode=mode,
            ),
        )
        latencies: list[float] = []
        responses: list[httpx.Response] = []
        transport = httpx.ASGITransport(app=app, client=("192.0.2.1", 1234))
        # The latencies are the library's: a full garbage collection of the test process
        # (tens of ms late in the suite) is kept out of the measured window.
        gc.collect()
        gc.disable()
        try:
            async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
                deadline = time.monotonic() + seconds

                async def user() -> None:
                    while time.monotonic() < deadline:
                        start = time.monotonic()
                        response = await client.get("/")
                        latencies.append(time.monotonic() - start)
                        responses.append(response)
                        await asyncio.sleep(0.01)

                await asyncio.gather(*(user() for _ in range(10)))
        finally:
            gc.enable()
            await app.storage.close()
    return (latencies, Counter(r.status_code for r in responses),
            Counter(e.source for e in events), responses)


def _p99(latencies: list[float]) -> float:
    return statistics.quantiles(latencies, n=100)[98]


@pytest.mark.parametrize("mode", ["open", "closed", "memory"])
async def test_slow_redis_costs_at_most_the_timeout(redis: RedisProcess, mode: str) -> None:
    """Redis 300 ms away, timeout 100 ms: p99 < 200 ms, max < 300 ms, the policy answers."""
    latencies, codes, sources, responses = await _run(redis, 0.3, mode, 1.5)
    assert len(latencies) >= 100
    assert _p99(latencies) < TIMEOUT + MARGIN, sorted(latencies)[-10:]
    assert max(latencies) < 0.3, sorted(latencies)[-10:]  # nobody waited for Redis
    assert sources == {SOURCES[mode]: len(latencies)}  # Redis never answered in time
    assert codes == {STATUS[mode]: len(latencies)}
    if mode == "closed":
        assert all(r.headers["retry-after"].isdigit() for r in responses)


async def test_a_little_slow_redis_still_decides(redis: RedisProcess) -> None:
    """The control: Redis 20 ms away, timeout 1 s: Redis decides all, in 40 ms to 1.1 s.

    (The timeout covers a new connection's handshake and a first NOSCRIPT too, several
    round trips: with a 100 ms timeout at this distance many calls on fresh
    connections time out.)
    """
    latencies, codes, sources, _ = await _run(redis, 0.02, "closed", 1.0, timeout=1.0)
    assert sources == {"storage": len(latencies)}
    assert codes == {200: len(latencies)}
    assert statistics.median(latencies) >= 0.04  # the proxy does delay both ways
    assert _p99(latencies) < 1.0 + MARGIN

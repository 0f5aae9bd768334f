"""The middleware on ``redis+sentinel://``: the primary killed, limits exact again after
the failover, and no 500 in between."""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections import Counter

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
from tests.redis_servers import SentinelDeployment

pytestmark = [pytest.mark.reliability, pytest.mark.redis, pytest.mark.slow]

LIMIT = 10


async def ok(request: Request) -> Response:
    return PlainTextResponse("ok")


def _as(ip: str) -> dict[str, str]:
    return {"x-forwarded-for": ip}


async def test_limits_exact_again_after_a_sentinel_failover(
    redis_sentinel: SentinelDeployment, redis_sentinel_url: str,
) -> None:
    """Kill the primary under load: only 200/429/503 meanwhile; afterwards a client with 7
    of 10 used gets exactly 3 more, and a new one exactly 10 of 30 concurrent requests."""
    redis_sentinel.wait_until_ready()
    events: list[DecisionEvent] = []
    app = RateLimitMiddleware(
        Starlette(routes=[Route("/", ok)]),
        tiers=[Tier("t", f"{LIMIT}/hour")],
        on_decision=events.append,
        settings=RateLimitSettings(
            storage_url=redis_sentinel_url,
            storage_prefix=f"rlrel:{uuid.uuid4().hex[:12]}:",
            storage_timeout=0.5,
            recovery_interval=0.3,
            failure_mode="closed",
            trusted_proxies=["127.0.0.1"],
        ),
    )
    transport = httpx.ASGITransport(app=app, client=("127.0.0.1", 1234))
    old = redis_sentinel.current_primary()
    try:
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            codes = [(await client.get("/", headers=_as("198.51.100.7"))).status_code
                     for _ in range(7)]
            assert codes == [200] * 7
            assert old.call("WAIT", 1, 2000) == 1  # the replica has every count so far

            old.kill()
            failover = asyncio.create_task(asyncio.to_thread(
                redis_sentinel.wait_for_failover, old, 20.0))
            during: Counter[int] = Counter()
            n = 0
            while not failover.done():  # bounded: wait_for_failover gives up after 20 s
                n += 1
                response = await client.get("/", headers=_as(f"203.0.113.{n % 250}"))
                during[response.status_code] += 1
                await asyncio.sleep(0.02)
            new = await failover
            assert new is not old
            assert set(during) <= {200, 429, 503}, during
            assert during[503] > 0  # the outage was seen, and answered by the policy

            # Poll until the storage decides again (the breaker closes after a trial call).
            deadline = time.monotonic() + 10
            while True:
                response = await client.get("/", headers=_as("192.0.2.99"))
                assert response.status_code in (200, 503), response
                if events[-1].source == "storage":
                    break
                assert time.monotonic() < deadline, "Redis never decided after the failover"
                await asyncio.sleep(0.05)

            codes = [(await client.get("/", headers=_as("198.51.100.7"))).status_code
                     for _ in range(5)]
            assert codes == [200] * 3 + [429] * 2

            burst = await asyncio.gather(*(client.get("/", headers=_as("198.51.100.8"))
                                           for _ in range(3 * LIMIT)))
            assert Counter(r.status_code for r in burst) == {200: LIMIT, 429: 2 * LIMIT}
    finally:
        await app.storage.close()
        # Back empty, as the new primary's replica: Sentinel would convert it too, but
        # only after its next 10 s INFO round; the rest of the session needs a replica.
        old.start()
        with contextlib.suppress(LookupError):
            primary = redis_sentinel.current_primary()
            if primary is not old:
                old.call("REPLICAOF", "127.0.0.1", primary.port)
        redis_sentinel.wait_until_ready(20.0)

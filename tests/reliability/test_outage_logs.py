"""A Redis outage under load logs a bounded number of lines, whatever the load.

Every path that meets the storage (decisions, quota reads, idempotency, slot releases
and renewals, settlements) logs the first failure of an outage and its end, with
counts; hundreds of failed calls in between add nothing to the log.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
import uuid
from collections import Counter

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route

from ratelimit_mw import Limit, RedisStorage, Tier, limit
from ratelimit_mw.idempotency import IdempotencyMiddleware, RedisIdempotencyStore
from ratelimit_mw.middleware import RateLimitMiddleware
from ratelimit_mw.quota import quota_router
from tests.conftest import middleware_arguments
from tests.redis_servers import own_redis

pytestmark = [pytest.mark.reliability, pytest.mark.redis]

# "ratelimit_mw <path> failed: …" (the decisions': "storage failure") and "… recovered: …".
_OUTAGE_LINE = re.compile(r"ratelimit_mw ([a-z ]+?) (failed|failure|recovered): ")
REFUNDED = Limit("1000/15 minutes", "fixed_window", name="failures", count="failures")


@limit(REFUNDED)  # a 200 does not count: each response settles its reservation back
async def work(request: Request) -> Response:
    await asyncio.sleep(0.2)  # long enough to be in flight when Redis goes
    return PlainTextResponse("done")


async def order(request: Request) -> Response:
    return PlainTextResponse("ordered", status_code=201)


def _app(storage: RedisStorage, store: RedisIdempotencyStore) -> Starlette:
    app = Starlette(routes=[Route("/work", work), Route("/orders", order, methods=["POST"]),
                            *quota_router(allow_anonymous=True).routes])
    app.add_middleware(RateLimitMiddleware, **middleware_arguments(
        tiers=[Tier("default", "1000000/day", concurrency=1000)],
        storage=storage, storage_timeout=0.1, recovery_interval=0.3, failure_mode="open",
        concurrency_lease=0.6, trusted_proxies=["127.0.0.1"]))
    app.add_middleware(IdempotencyMiddleware, store=store, fail_open=True)
    return app


async def _load(client: httpx.AsyncClient, seconds: float, statuses: Counter[int]) -> None:
    """Ten callers, each cycling through a slot-and-settlement request, a quota read and
    an idempotent order, for ``seconds``."""
    deadline = time.monotonic() + seconds

    async def caller(n: int) -> None:
        i = 0
        while time.monotonic() < deadline:
            i += 1
            ip = {"x-forwarded-for": f"198.51.100.{n}"}
            for reply in await asyncio.gather(
                    client.get("/work", headers=ip),
                    client.get("/api/v1/account/quota", headers=ip),
                    client.post("/orders", headers={**ip, "Idempotency-Key": f"{n}-{i}"})):
                statuses[reply.status_code] += 1

    await asyncio.gather(*(caller(n) for n in range(10)))


@pytest.mark.slow
async def test_an_outage_under_load_logs_two_lines_a_path(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Redis killed under a mixed load for 1.5 s, then back: each path logs its first
    failure and its recovery once, not a line a failed call."""
    monkeypatch.setattr("ratelimit_mw.outages.QUIET_SECONDS", 0.5)
    with own_redis() as redis:
        url = f"redis://127.0.0.1:{redis.port}/0"
        storage = RedisStorage.from_url(url, prefix=f"rlout:{uuid.uuid4().hex[:12]}:",
                                        timeout=0.1)
        store = RedisIdempotencyStore.from_url(url, prefix=f"rlidem:{uuid.uuid4().hex}:",
                                               timeout=0.1, recovery_interval=0.3)
        transport = httpx.ASGITransport(app=_app(storage, store), client=("127.0.0.1", 1))
        before: Counter[int] = Counter()
        during: Counter[int] = Counter()
        after: Counter[int] = Counter()
        try:
            async with httpx.AsyncClient(transport=transport, base_url="http://test",
                                         timeout=10) as client:
                await _load(client, 0.5, before)
                with caplog.at_level(logging.WARNING):
                    loading = asyncio.ensure_future(_load(client, 1.5, during))
                    await asyncio.sleep(0.1)
                    redis.kill()
                    await loading
                    await asyncio.to_thread(redis.start)
                    await _load(client, 1.5, after)
                    await asyncio.sleep(0.7)  # the quiet spell that ends unseen outages
        finally:
            await store.close()
            await storage.close()
    assert set(before) == {200, 201}
    assert sum(during.values()) > 150 and 500 not in during
    lines = [record.getMessage() for record in caplog.records]
    said = [match.groups() for line in lines if (match := _OUTAGE_LINE.match(line))]
    began = Counter(path for path, what in said if what in ("failed", "failure"))
    ended = Counter(path for path, what in said if what == "recovered")
    for path in ("storage", "quota read", "idempotency store", "slot release", "settlement"):
        assert began[path] >= 1, lines
    # Each path logs an outage's start and end: once, or twice where a path fails again
    # as Redis comes back (a connection still being set up).
    assert began == ended, lines
    assert all(count <= 2 for count in began.values()), lines
    assert len(lines) <= 24, lines  # the paths' two lines and the breakers opening

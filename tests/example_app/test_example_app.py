"""The example app over real HTTP, on memory and on Redis: every feature it shows."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from datetime import UTC, datetime

import httpx
import pytest

from .conftest import ENTERPRISE, FREE, PRO, ROOT, STARTER, StartServer

pytestmark = pytest.mark.slow


async def test_free_burst_of_20_then_429_with_headers_and_body(
    start_server: StartServer, kind: str,
) -> None:
    """The free tier's token bucket admits a burst of 20; the 21st is a 429 that says why."""
    server = start_server(kind)
    async with httpx.AsyncClient(base_url=server.url, headers=FREE) as client:
        codes = [(await client.get("/api/v1/hello")).status_code for _ in range(20)]
        denied = await client.get("/api/v1/hello")
    assert codes == [200] * 20
    assert denied.status_code == 429
    assert denied.headers["x-ratelimit-limit"] == "20"
    assert denied.headers["x-ratelimit-remaining"] == "0"
    assert int(denied.headers["retry-after"]) in range(1, 8)  # one token: 6 s at 10/minute
    assert denied.headers["cache-control"] == "no-store"
    assert denied.headers["ratelimit-policy"] == (
        '"burst";q=20;w=60,"daily";q=1000;w=86400,"concurrent";q=2;qu="concurrent-requests"')
    body = denied.json()
    assert body["error"] == "rate_limit_exceeded"
    assert body["limit"] == 20
    assert body["retry_after_seconds"] == int(denied.headers["retry-after"])


async def test_anonymous_tier_is_keyed_by_ip_and_unknown_keys_get_401(
    start_server: StartServer, kind: str,
) -> None:
    """No key: 5/minute by client IP; an unknown key: 401 and nothing counted; /health exempt."""
    server = start_server(kind)
    async with httpx.AsyncClient(base_url=server.url) as client:
        unknown = await client.get("/api/v1/hello", headers={"X-API-Key": "made-up"})
        codes = [(await client.get("/api/v1/hello")).status_code for _ in range(6)]
        health = [await client.get("/health") for _ in range(10)]
        keyed = await client.get("/api/v1/hello", headers=FREE)
    assert unknown.status_code == 401
    assert codes == [200] * 5 + [429]
    assert all(r.status_code == 200 and "x-ratelimit-limit" not in r.headers for r in health)
    assert keyed.status_code == 200


async def test_another_api_key_header_is_checked_too(start_server: StartServer) -> None:
    """With RATELIMIT_API_KEY_HEADER set, the key is read from that header for the 401
    check as for the tier: a made-up key there is refused, a real one gets its tier."""
    server = start_server("memory", api_key_header="x-token")
    async with httpx.AsyncClient(base_url=server.url) as client:
        unknown = await client.get("/api/v1/hello", headers={"X-Token": "made-up"})
        quota = await client.get("/api/v1/account/quota", headers={"X-Token": "demo-pro"})
    assert unknown.status_code == 401
    assert quota.status_code == 200
    assert quota.json()["plan"] == "pro"


async def test_concurrency_two_of_three_slow_requests_pass_and_slots_come_back(
    start_server: StartServer, kind: str,
) -> None:
    """Free tier: 2 in flight. Three at once: two 200s, one 429 (concurrent policy); after
    they end, both slots are free again."""
    server = start_server(kind)
    async with httpx.AsyncClient(base_url=server.url, headers=FREE, timeout=10) as client:
        first = [client.get("/api/v1/slow", params={"seconds": 1.0}) for _ in range(2)]
        tasks = [asyncio.ensure_future(call) for call in first]
        await asyncio.sleep(0.4)  # both are in flight now
        third = await client.get("/api/v1/slow", params={"seconds": 0})
        done = await asyncio.gather(*tasks)
        again = await asyncio.gather(
            *(client.get("/api/v1/slow", params={"seconds": 0.3}) for _ in range(2)))
        # A slot is back before the client sees the end of its response: back-to-back
        # pairs never find both slots still taken.
        pairs = [await asyncio.gather(*(client.get("/api/v1/slow", params={"seconds": 0})
                                        for _ in range(2))) for _ in range(5)]
    assert [r.status_code for pair in pairs for r in pair] == [200] * 10
    assert sorted(r.status_code for r in done) == [200, 200]
    assert third.status_code == 429
    assert third.headers["retry-after"] == "1"
    assert '"concurrent";r=0;t=1' in third.headers["ratelimit"]
    assert third.json()["message"].startswith("Too many requests in flight")
    assert [r.status_code for r in again] == [200, 200]


@pytest.mark.redis
async def test_killed_worker_frees_its_slots_within_the_lease(
    start_server: StartServer,
) -> None:
    """Two servers on one Redis. kill -9 the first during two /slow calls: the other one
    sees both slots taken until their 2 s lease ends, then admits again."""
    doomed = start_server("redis", concurrency_lease="2")
    other = start_server("redis", concurrency_lease="2")
    async with httpx.AsyncClient(headers=FREE, timeout=10) as client:
        hung = [asyncio.ensure_future(client.get(f"{doomed.url}/api/v1/slow",
                                                 params={"seconds": 20})) for _ in range(2)]
        await asyncio.sleep(0.3)
        taken_by = time.monotonic()  # both slots were taken before this
        doomed.kill_hard()
        results = await asyncio.gather(*hung, return_exceptions=True)
        assert all(isinstance(r, httpx.TransportError) for r in results)
        held = await client.get(f"{other.url}/api/v1/hello")
        assert held.status_code == 429
        assert held.json()["message"].startswith("Too many requests in flight")
        while held.status_code == 429 and time.monotonic() - taken_by < 5:
            await asyncio.sleep(0.05)
            held = await client.get(f"{other.url}/api/v1/hello")
        freed_after = time.monotonic() - taken_by
        both = await asyncio.gather(
            *(client.get(f"{other.url}/api/v1/slow", params={"seconds": 0.3}) for _ in range(2)))
    assert held.status_code == 200
    assert 1.2 < freed_after < 2.5, freed_after
    assert [r.status_code for r in both] == [200, 200]


async def test_quota_numbers_match_the_requests_made(
    start_server: StartServer, kind: str,
) -> None:
    """After 5 requests, the quota counts 5 (asking for it is exempt, like GitHub's)."""
    server = start_server(kind)
    async with httpx.AsyncClient(base_url=server.url, headers=FREE) as client:
        for _ in range(5):
            assert (await client.get("/api/v1/hello")).status_code == 200
        quota = await client.get("/api/v1/account/quota")
    assert quota.status_code == 200
    body = quota.json()
    now = datetime.now(UTC)
    nxt = datetime(now.year + now.month // 12, now.month % 12 + 1, 1, tzinfo=UTC)
    assert body == {
        "plan": "free",
        "period": f"{now.year:04d}-{now.month:02d}",
        "limits": {"requests_per_minute": 10, "requests_per_day": 1000,
                   "tokens_per_minute": 10000},
        "usage": {"requests_today": 5, "requests_this_minute": 5, "tokens_this_minute": 0},
        "resets_at": nxt.strftime("%Y-%m-%dT%H:%M:%SZ"),
        "burst": {"requests_per_minute": 20},
        "concurrency": {"limit": 2, "in_flight": 0},
    }
    assert "x-ratelimit-limit" not in quota.headers


async def test_callers_see_only_their_own_quota(start_server: StartServer, kind: str) -> None:
    """Each key sees its own plan and counts; enterprise its negotiated limits."""
    server = start_server(kind)
    async with httpx.AsyncClient(base_url=server.url) as client:
        for _ in range(3):
            await client.get("/api/v1/hello", headers=FREE)
        await client.get("/api/v1/hello", headers=STARTER)
        free = (await client.get("/api/v1/account/quota", headers=FREE)).json()
        starter = (await client.get("/api/v1/account/quota", headers=STARTER)).json()
        pro = (await client.get("/api/v1/account/quota", headers=PRO)).json()
        enterprise = (await client.get("/api/v1/account/quota", headers=ENTERPRISE)).json()
    assert (free["plan"], free["usage"]["requests_today"]) == ("free", 3)
    assert (starter["plan"], starter["usage"]["requests_today"]) == ("starter", 1)
    assert starter["limits"] == {"requests_per_minute": 100, "requests_per_day": 50000,
                                 "tokens_per_minute": 50000}
    assert (pro["plan"], pro["usage"]["requests_today"]) == ("pro", 0)
    assert pro["limits"] == {"requests_per_minute": 1000, "requests_per_day": 500000,
                             "tokens_per_minute": 200000}
    # The override the app gives demo-enterprise at start-up: its negotiated limits.
    assert enterprise["plan"] == "enterprise"
    assert enterprise["limits"] == {"requests_per_minute": 5000, "requests_per_day": 5000000}
    assert enterprise["burst"] == {"requests_per_minute": 10000}
    assert enterprise["usage"] == {"requests_today": 0, "requests_this_minute": 0}
    assert enterprise["concurrency"] == {"limit": 200, "in_flight": 0}


@pytest.mark.parametrize("path", ["/api/v1/account/quota", "/api/v1/account/quota/history"])
async def test_quota_endpoints_need_a_valid_key(
    start_server: StartServer, kind: str, path: str,
) -> None:
    """No key (anonymous) or an unknown key: 401 on both quota endpoints."""
    server = start_server(kind)
    async with httpx.AsyncClient(base_url=server.url) as client:
        anonymous = await client.get(path)
        unknown = await client.get(path, headers={"X-API-Key": "demo-nobody"})
    assert anonymous.status_code == unknown.status_code == 401
    assert "www-authenticate" in anonymous.headers


async def test_history_buckets_add_up_to_the_requests_made(
    start_server: StartServer, kind: str,
) -> None:
    """Hourly and daily buckets both sum to every admitted request of the caller."""
    server = start_server(kind)
    async with httpx.AsyncClient(base_url=server.url, headers=STARTER) as client:
        for _ in range(7):
            await client.get("/api/v1/hello")
        hours = (await client.get("/api/v1/account/quota/history",
                                  params={"granularity": "hour"})).json()
        today = datetime.now(UTC).strftime("%Y-%m-%d")
        days = (await client.get("/api/v1/account/quota/history",
                                 params={"granularity": "day", "from": today, "to": today})).json()
        bad = await client.get("/api/v1/account/quota/history", params={"granularity": "week"})
    assert hours["total"] == sum(b["requests"] for b in hours["buckets"]) == 7
    assert len(hours["buckets"]) in (24, 25)
    assert days["buckets"] == [{"start": f"{today}T00:00:00Z", "requests": 7, "tokens": 0}]
    assert (days["total"], days["total_tokens"]) == (7, 0)
    assert bad.status_code == 400


@pytest.mark.redis
async def test_two_workers_on_redis_share_every_limit_exactly(
    start_server: StartServer,
) -> None:
    """``--workers 2`` on Redis: the burst, the route limit, the concurrency slots and the
    usage history are each counted once across both processes."""
    server = start_server("redis", workers=2)
    workers: set[int] = set()
    codes: list[int] = []
    for _ in range(30):  # a new connection each time, so both workers get requests
        async with httpx.AsyncClient(base_url=server.url, headers=FREE) as client:
            response = await client.get("/api/v1/hello")
            codes.append(response.status_code)
            if response.status_code == 200:
                workers.add(response.json()["worker"])
    assert codes == [200] * 20 + [429] * 10
    assert len(workers) == 2, workers
    reports = []
    for _ in range(3):
        async with httpx.AsyncClient(base_url=server.url, headers=PRO) as client:
            reports.append((await client.post("/api/v1/reports")).status_code)
    assert reports == [201, 201, 429]
    clients = [httpx.AsyncClient(base_url=server.url, headers=STARTER, timeout=10)
               for _ in range(12)]
    try:
        slow = await asyncio.gather(*(c.get("/api/v1/slow", params={"seconds": 1.0})
                                      for c in clients))
    finally:
        for c in clients:
            await c.aclose()
    assert sorted(r.status_code for r in slow) == [200] * 10 + [429] * 2
    async with httpx.AsyncClient(base_url=server.url, headers=PRO) as client:
        pro = (await client.get("/api/v1/account/quota")).json()
    assert pro["usage"]["requests_today"] == 2  # two reports (a denied one counts nothing)


async def test_payment_is_replayed_for_the_same_idempotency_key(
    start_server: StartServer, kind: str,
) -> None:
    """Same key and body: the stored answer again, marked replayed; no key: 400;
    same key, other body: 422."""
    server = start_server(kind)
    async with httpx.AsyncClient(base_url=server.url, headers=PRO) as client:
        first = await client.post("/api/v1/payments", json={"amount": 42},
                                  headers={"Idempotency-Key": "order-1"})
        replay = await client.post("/api/v1/payments", json={"amount": 42},
                                   headers={"Idempotency-Key": "order-1"})
        other = await client.post("/api/v1/payments", json={"amount": 43},
                                  headers={"Idempotency-Key": "order-1"})
        missing = await client.post("/api/v1/payments", json={"amount": 42})
        fresh = await client.post("/api/v1/payments", json={"amount": 42},
                                  headers={"Idempotency-Key": "order-2"})
    assert first.status_code == replay.status_code == 201
    assert replay.json() == first.json()
    assert replay.headers["x-idempotent-replayed"] == "true"
    assert len(replay.headers.get_list("x-ratelimit-remaining")) == 1  # today's, not stored
    assert "x-idempotent-replayed" not in first.headers
    assert other.status_code == 422
    assert missing.status_code == 400
    assert fresh.json()["payment_id"] != first.json()["payment_id"]


@pytest.mark.redis
@pytest.mark.parametrize("deployment", ["sentinel", "cluster"])
async def test_two_workers_on_sentinel_or_cluster_run_a_payment_once(
    start_server: StartServer, deployment: str,
) -> None:
    """``--workers 2`` on Sentinel or Cluster: the idempotency records are shared through
    Redis like the limits, so a client retrying one key is charged once, whichever
    worker it reaches."""
    server = start_server(deployment, workers=2)
    answers = []
    for _ in range(20):  # a new connection each time, so both workers get requests
        async with httpx.AsyncClient(base_url=server.url, headers=PRO) as client:
            answers.append(await client.post("/api/v1/payments", json={"amount": 100},
                                             headers={"Idempotency-Key": "order-1"}))
    assert {r.status_code for r in answers} == {201}
    assert len({r.json()["payment_id"] for r in answers}) == 1
    assert [r.headers.get("x-idempotent-replayed") for r in answers] == [None] + ["true"] * 19


@pytest.mark.parametrize("callers", ["forwarded-ips", "api-key-header"])
async def test_callers_the_rate_limiter_tells_apart_never_share_a_payment(
    start_server: StartServer, callers: str,
) -> None:
    """Idempotency records are scoped like the limits: by the key in the configured API
    key header, else by the client IP behind the trusted proxies."""
    if callers == "forwarded-ips":  # uvicorn passes X-Forwarded-For on; the limiter reads it
        server = start_server("memory", args=["--no-proxy-headers"], trusted_proxies="127.0.0.1")
        first, second = ({"X-Forwarded-For": ip} for ip in ("203.0.113.7", "198.51.100.9"))
    else:
        server = start_server("memory", api_key_header="x-token")
        first, second = ({"X-Token": key} for key in ("demo-free", "demo-pro"))
    async with httpx.AsyncClient(base_url=server.url) as client:
        answers = [await client.post("/api/v1/payments", json={"amount": 100},
                                     headers={"Idempotency-Key": "order-1", **caller})
                   for caller in (first, second, first)]
    assert [r.status_code for r in answers] == [201] * 3
    assert answers[0].json()["payment_id"] != answers[1].json()["payment_id"]
    assert "x-idempotent-replayed" not in answers[1].headers
    assert answers[2].headers["x-idempotent-replayed"] == "true"


def test_a_storage_url_without_an_idempotency_store_fails_at_start_up() -> None:
    """A storage URL the idempotency store can't use stops the app, naming the URL; it
    never falls back to per-process memory."""
    env = {**os.environ, "RATELIMIT_STORAGE_URL": "memcached://app:secret@cache:11211"}
    result = subprocess.run([sys.executable, "-c", "import example_app.main"], cwd=ROOT,
                            env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode != 0
    assert "ConfigError: couldn't keep idempotency records at 'memcached://app:***@cache" in (
        result.stderr)
    assert "secret" not in result.stderr


async def test_upstream_breaker_opens_and_answers_503_with_retry_after(
    start_server: StartServer, kind: str,
) -> None:
    """A failing upstream: 502s until the breaker has seen enough, then 503 at once."""
    server = start_server(kind)
    async with httpx.AsyncClient(base_url=server.url, headers=PRO) as client:
        healthy = await client.get("/api/v1/upstream", params={"failure_rate": 0})
        codes = [(await client.get("/api/v1/upstream", params={"failure_rate": 1})).status_code
                 for _ in range(8)]
        refused = await client.get("/api/v1/upstream", params={"failure_rate": 0})
    assert healthy.status_code == 200
    assert codes[:4] == [502] * 4  # 1 success + 4 failures: 80% of 5 calls opens it
    assert codes[4:] == [503] * 4
    assert refused.status_code == 503
    assert refused.headers["retry-after"].isdigit()
    assert 1 <= int(refused.headers["retry-after"]) <= 10
    body = refused.json()  # the 429's shape, top level
    assert (body["error"], body["circuit"], body["retry_after_seconds"]) == (
        "service_unavailable", "upstream", int(refused.headers["retry-after"]))

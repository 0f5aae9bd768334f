"""Redis killed (SIGKILL) under load and restarted on its port, in each failure mode.

Two uvicorn workers decide on a Redis of the test's own while a steady load runs.
``open`` lets every request through, ``closed`` answers only 503 + Retry-After while
Redis is down, ``memory`` keeps enforcing limits per process; every mode decides on
Redis again within 5 s of its return, and every key it wrote has a TTL.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections import Counter
from collections.abc import Mapping

import pytest

from ratelimit_mw import Hit, Limit, RedisStorage
from tests.redis_servers import RedisProcess, own_redis
from tests.reliability.servers import RawHTTP, Reply, assert_keys_expire, uvicorn_server

pytestmark = [pytest.mark.reliability, pytest.mark.redis, pytest.mark.slow]

WORKERS = 2
TIER = "1000000/day"  # the load never reaches it: any 429 on "/" is Redis-only state
LOCAL_LIMIT = 20  # of /alg/fixed_window: what the memory fallback must still enforce
RECOVERY_S = 5.0


def _client(ip: str) -> Mapping[str, str]:
    """Headers that make the request count for ``ip`` (the app trusts loopback as a proxy)."""
    return {"x-forwarded-for": ip}


LOAD = _client("198.51.100.1")
PROBE_IP = "198.51.100.2"
LOCAL = _client("198.51.100.3")


async def _exhaust_in_redis(url: str, prefix: str, ip: str) -> None:
    """Use up the tier limit of ``ip`` in Redis alone: only a Redis decision denies it now."""
    storage = RedisStorage.from_url(url, prefix=prefix)
    try:
        # The tier's limits are hits of scope "" (see ratelimit_mw.limit_sets.make_limit_set).
        verdict = await storage.decide(f"ip:{ip}", [Hit(Limit(TIER), cost=1_000_000)])
        assert verdict.allowed
    finally:
        await storage.close()


async def _until_decided_by_redis(server: RawHTTP) -> float:
    """Probe until 10 answers in a row, from every worker, are the 429 that only Redis
    can give; when that streak began."""
    streak: list[Reply] = []
    seen: list[tuple[int, str, str]] = []
    deadline = time.monotonic() + RECOVERY_S + 1
    while time.monotonic() < deadline:
        # A new connection per probe, so the probes reach every worker.
        reply = (await server.burst([("/", {**_client(PROBE_IP), "connection": "close"})]))[0]
        assert reply.status in (200, 429, 503), reply
        seen.append((reply.status, reply.headers["x-worker-pid"], reply.headers["x-rl-source"]))
        streak = [*streak, reply] if reply.status == 429 else []
        if len(streak) >= 10 and len({r.headers["x-worker-pid"] for r in streak}) == WORKERS:
            return streak[0].sent
        await asyncio.sleep(0.02)
    pytest.fail(f"not decided by Redis again {RECOVERY_S + 1} s after it came back; "
                f"probes (status, worker, source): {seen[-30:]}")


def _degraded(replies: list[Reply], since: float) -> list[float]:
    """When the answers done after ``since`` that Redis did not decide came."""
    return [r.done for r in replies if r.done > since and r.headers["x-rl-source"] not in (
        "storage", "blocked")]


async def _until_steady(replies: list[Reply], since: float, deadline: float,
                        steady_s: float = 1.0) -> None:
    """Poll until Redis has decided every answer for ``steady_s`` (or the deadline)."""
    while time.monotonic() < deadline:
        if time.monotonic() - max(_degraded(replies, since), default=since) >= steady_s:
            return
        await asyncio.sleep(0.05)


async def _wait_replies(replies: list[Reply], after: float, count: int, limit_s: float) -> None:
    """Poll until ``count`` replies of requests sent after ``after`` are in."""
    deadline = time.monotonic() + limit_s
    while sum(r.sent > after for r in replies) < count and time.monotonic() < deadline:
        await asyncio.sleep(0.02)


@pytest.mark.parametrize("mode", ["open", "closed", "memory"])
async def test_redis_killed_under_load_and_restarted(mode: str) -> None:
    """Kill -9 Redis under load, restart it: the failure policy holds, then Redis decides."""
    prefix = f"rlrel:{uuid.uuid4().hex[:12]}:"
    with own_redis() as redis:
        env = {
            "RATELIMIT_STORAGE_URL": f"redis://127.0.0.1:{redis.port}/0",
            "RATELIMIT_STORAGE_PREFIX": prefix,
            "RATELIMIT_FAILURE_MODE": mode,
            "RATELIMIT_STORAGE_TIMEOUT": "0.25",
            "RATELIMIT_RECOVERY_INTERVAL": "0.5",
            "RATELIMIT_TRUSTED_PROXIES": "127.0.0.1",
            "RATELIMIT_DEFAULT_LIMITS": TIER,
            "RL_APP_LIMIT": str(LOCAL_LIMIT),
        }
        with uvicorn_server(env, workers=WORKERS) as url:
            await _outage(url, redis, mode, prefix)


async def _outage(url: str, redis: RedisProcess, mode: str, prefix: str) -> None:
    server = RawHTTP(url, connections=16)
    load: list[Reply] = []
    stop = asyncio.Event()
    running = asyncio.create_task(server.until(stop, ("/", LOAD), load, limit_s=30))
    try:
        await _wait_replies(load, 0, 100, 5)

        # In a thread, so the load goes on meanwhile.
        killed = time.monotonic()
        await asyncio.to_thread(redis.kill)
        down_from = time.monotonic()
        local = await RawHTTP(url, connections=20).burst(
            [("/alg/fixed_window", LOCAL)] * (5 * LOCAL_LIMIT * WORKERS))
        await _wait_replies(load, down_from, 150, 5)

        down_until = time.monotonic()
        await asyncio.to_thread(redis.start)
        back = time.monotonic()
        await _exhaust_in_redis(f"redis://127.0.0.1:{redis.port}/0", prefix, PROBE_IP)
        enforced_at = await _until_decided_by_redis(server)
        await _until_steady(load, back, back + RECOVERY_S + 1)
    finally:
        stop.set()
        await asyncio.wait_for(running, 30)

    before = [r for r in load if r.done < killed]
    down = [r for r in load if r.sent > down_from and r.done < down_until]
    # Recovered: the last answer not decided by Redis (breakers close one worker at a time,
    # each after a half-open trial), and Redis alone decides everything after it.
    recovered_at = max(_degraded(load, back), default=back)
    after = [r for r in load if r.sent > recovered_at]
    every = Counter(r.status for r in load)
    assert before and down and after, (len(before), len(down), len(after))
    assert not [r.error for r in load if r.status == 0], "connection errors"
    assert 500 not in every

    assert {r.status for r in before} == {200}
    assert {r.headers["x-rl-source"] for r in before} == {"storage"}
    if mode == "open":
        # No request fails: every one of them, before, during and after, is a 200.
        assert set(every) == {200}, every
        assert {r.status for r in local} == {200}
        assert {r.headers["x-rl-source"] for r in down} == {"unavailable"}
    elif mode == "closed":
        assert set(every) <= {200, 503}, every
        assert {r.status for r in down} == {503}
        assert all(r.headers["retry-after"].isdigit() for r in down)
        assert {r.status for r in local} == {503}
    else:
        assert set(every) == {200}, every
        assert {r.headers["x-rl-source"] for r in down} == {"fallback"}
        admitted = Counter(r.headers["x-worker-pid"] for r in local if r.status == 200)
        answered = Counter(r.headers["x-worker-pid"] for r in local)
        assert {r.status for r in local} == {200, 429}
        for pid, count in answered.items():
            # The fallback starts empty per process: each admits up to the limit, no more.
            assert admitted[pid] == min(count, LOCAL_LIMIT), (admitted, answered)
    assert {r.status for r in after} == {200}
    assert {r.headers["x-rl-source"] for r in after} == {"storage"}
    assert recovered_at - back < RECOVERY_S
    assert enforced_at - back < RECOVERY_S

    # Nothing leaks: every key written since Redis came back expires.
    assert assert_keys_expire(f"redis://127.0.0.1:{redis.port}/0", prefix) >= 2

"""Four uvicorn worker processes sharing one Redis (or Cluster) admit exactly the limit."""

from __future__ import annotations

import asyncio
import uuid
from collections import Counter
from collections.abc import Iterator

import pytest

from ratelimit_mw.limits import ALGORITHM_NAMES
from tests.reliability.servers import RawHTTP, assert_keys_expire, delete_prefix, uvicorn_server

pytestmark = [pytest.mark.reliability, pytest.mark.redis, pytest.mark.slow]

LIMIT = 100
REQUESTS = 2000
WORKERS = 4


def _env(storage_url: str, prefix: str) -> dict[str, str]:
    return {
        "RATELIMIT_STORAGE_URL": storage_url,
        "RATELIMIT_STORAGE_PREFIX": prefix,
        # A storage failure must show (as a 503), never pass as an admitted request;
        # the timeout is generous because 4 workers, Redis and the client share 2 cores.
        "RATELIMIT_FAILURE_MODE": "closed",
        "RATELIMIT_STORAGE_TIMEOUT": "5",
        "RATELIMIT_DEFAULT_LIMITS": "1000000/day",
        "RL_APP_LIMIT": str(LIMIT),
        "RL_APP_PERIOD": "day",  # nothing refills during the test
    }


@pytest.fixture(scope="module")
def redis_server(redis_url: str) -> Iterator[tuple[str, str]]:
    """4 workers on the shared Redis; (base URL, key prefix)."""
    prefix = f"rlrel:{uuid.uuid4().hex[:12]}:"
    try:
        with uvicorn_server(_env(redis_url, prefix), workers=WORKERS) as url:
            yield url, prefix
    finally:
        delete_prefix(redis_url, prefix)


async def _flood(url: str, path: str) -> tuple[Counter[int], Counter[str], set[str]]:
    """2000 requests at once over 100 connections: statuses, sources, worker pids."""
    replies = await RawHTTP(url, connections=100).burst([(path, None)] * REQUESTS)
    assert len(replies) == REQUESTS
    errors = [reply.error for reply in replies if reply.status == 0]
    assert not errors, errors[:5]
    admitted = Counter(r.headers["x-rl-source"] for r in replies if r.status == 200)
    pids = {r.headers["x-worker-pid"] for r in replies}
    return Counter(r.status for r in replies), admitted, pids


@pytest.mark.parametrize("algorithm", ALGORITHM_NAMES)
async def test_four_workers_on_redis_admit_exactly_the_limit(
    redis_server: tuple[str, str], redis_url: str, algorithm: str,
) -> None:
    """2000 concurrent requests, limit 100, 4 processes on Redis: exactly 100 x 200, 1900 x 429."""
    url, prefix = redis_server
    codes, admitted_by, pids = await _flood(url, f"/alg/{algorithm}")
    assert codes == {200: LIMIT, 429: REQUESTS - LIMIT}
    assert admitted_by == {"storage": LIMIT}
    assert len(pids) >= 2, f"only worker(s) {pids} answered"
    assert assert_keys_expire(redis_url, prefix) >= 1


@pytest.fixture(scope="module")
def cluster_server(redis_cluster_url: str) -> Iterator[tuple[str, str]]:
    """4 workers on the throwaway Redis Cluster (its keys are left to expire)."""
    prefix = f"rlrel:{uuid.uuid4().hex[:12]}:"
    with uvicorn_server(_env(redis_cluster_url, prefix), workers=WORKERS) as url:
        yield url, prefix


@pytest.mark.parametrize("algorithm", ALGORITHM_NAMES)
async def test_four_workers_on_cluster_admit_exactly_the_limit(
    cluster_server: tuple[str, str], redis_cluster_url: str, algorithm: str,
) -> None:
    """The same flood on Redis Cluster: exactly 100 admitted of 2000."""
    url, prefix = cluster_server
    codes, admitted_by, _ = await _flood(url, f"/alg/{algorithm}")
    assert codes == {200: LIMIT, 429: REQUESTS - LIMIT}
    assert admitted_by == {"storage": LIMIT}
    assert assert_keys_expire(redis_cluster_url, prefix) >= 1


async def test_the_flood_spreads_over_every_worker(redis_server: tuple[str, str]) -> None:
    """The exactness above is across processes: a flood of exempt requests reaches all 4."""
    url, _ = redis_server
    pids: set[str] = set()
    for _ in range(5):  # the kernel picks the worker for each connection: a few rounds
        replies = await RawHTTP(url, connections=100).burst([("/health", None)] * 400)
        pids |= {reply.headers["x-worker-pid"] for reply in replies}
        if len(pids) == WORKERS:
            break
        await asyncio.sleep(0.05)
    assert len(pids) == WORKERS

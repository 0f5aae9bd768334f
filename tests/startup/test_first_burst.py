"""Exact from the first request: two fresh uvicorn workers, whose first traffic is a
burst of 40 concurrent requests from one client allowed 5 a minute, admit exactly 5,
start after start, on Redis, Redis Cluster and Sentinel, failing open.

The storage timeout is 100 ms, twice the default: the test host runs both workers,
five to eight Redis servers and the client on two shared cores, where a real round
trip of a loaded Redis passes 50 ms now and then. Without the start-up work the
first bursts admit 30 to 40 at 100 ms as at 50 ms: the cold start costs far more.
"""

from __future__ import annotations

import uuid
from collections import Counter

import pytest

from tests.reliability.servers import RawHTTP, uvicorn_server

pytestmark = [pytest.mark.reliability, pytest.mark.redis, pytest.mark.slow]

LIMIT = 5
BURST = 40
STARTS = 10
WORKERS = 2


async def _first_burst(storage_url: str) -> tuple[Counter[int], Counter[str]]:
    """Start 2 workers on ``storage_url`` with keys of their own, send the burst as the
    very first limited traffic: the statuses, and the decisions not made by the storage
    (nor by the cache of keys it denied)."""
    env = {"RATELIMIT_STORAGE_URL": storage_url,
           "RATELIMIT_STORAGE_PREFIX": f"rlburst:{uuid.uuid4().hex[:12]}:",
           "RATELIMIT_STORAGE_TIMEOUT": "0.1",
           "RL_APP_LIMIT": str(LIMIT), "RL_APP_PERIOD": "minute"}
    # uvicorn_server waits for /health, which is exempt: nothing reaches the storage.
    with uvicorn_server(env, workers=WORKERS) as base:
        replies = await RawHTTP(base, connections=BURST).burst(
            [("/alg/sliding_window", None)] * BURST)
    errors = [reply.error for reply in replies if reply.status == 0]
    assert not errors, errors[:5]
    return (Counter(reply.status for reply in replies),
            Counter(reply.headers["x-rl-source"] for reply in replies
                    if reply.headers["x-rl-source"] not in ("storage", "blocked")))


@pytest.mark.parametrize("backend", ["redis", "cluster", "sentinel"])
async def test_the_first_burst_after_each_start_admits_exactly_the_limit(
    backend: str, request: pytest.FixtureRequest,
) -> None:
    """10 fresh starts in a row: each first burst of 40 admits 5, every request decided
    by the storage (none let through undecided)."""
    if backend == "sentinel":
        request.getfixturevalue("redis_sentinel").wait_until_ready()
    fixture = "redis_url" if backend == "redis" else f"redis_{backend}_url"
    storage_url = request.getfixturevalue(fixture)
    outcomes = [await _first_burst(storage_url) for _ in range(STARTS)]
    statuses = [dict(codes) for codes, _ in outcomes]
    assert statuses == [{200: LIMIT, 429: BURST - LIMIT}] * STARTS
    undecided = [dict(by) for _, by in outcomes]
    assert undecided == [{}] * STARTS

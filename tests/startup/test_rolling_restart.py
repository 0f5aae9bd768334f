"""A rolling restart lets nothing through: 2 uvicorn workers, steady traffic from one
client at 3 times its limit, and the workers replaced twice (``SIGHUP`` to uvicorn's
manager) meanwhile: exactly the limit is admitted, every request decided by the
storage."""

from __future__ import annotations

import asyncio
import os
import signal
import time
import uuid
from pathlib import Path

import httpx
import pytest

from tests.reliability.servers import RawHTTP, Reply, uvicorn_server

pytestmark = [pytest.mark.reliability, pytest.mark.redis, pytest.mark.slow]

LIMIT = 30
PAUSE = 0.1  # between two requests: 10 a second, the limit's worth every 3 s
RESTARTS = 2


def _manager(base: str) -> int:
    """uvicorn's manager process: the leader of its workers' process group."""
    pid = int(httpx.get(f"{base}/health", headers={"connection": "close"})
              .headers["x-worker-pid"])
    return os.getpgid(pid)


def _workers(manager: int) -> set[int]:
    """The worker processes of ``manager`` now (its children but multiprocessing's
    resource tracker)."""
    found = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            parent = int((entry / "stat").read_text().rpartition(")")[2].split()[1])
            helper = b"resource_tracker" in (entry / "cmdline").read_bytes()
        except (OSError, IndexError, ValueError):
            continue  # gone meanwhile
        if parent == manager and not helper:
            found.add(int(entry.name))
    return found


async def _replace_workers(manager: int, timeout: float = 90.0) -> None:
    """``SIGHUP`` the manager, then wait until every worker is a new one."""
    old = _workers(manager)
    os.kill(manager, signal.SIGHUP)
    deadline = time.monotonic() + timeout
    while True:
        now = _workers(manager)
        if len(now) == len(old) and not now & old:
            return
        assert time.monotonic() < deadline, f"workers {old} not replaced: {now}"
        await asyncio.sleep(0.1)


@pytest.mark.parametrize("backend", ["redis", "cluster"])
async def test_rolling_restarts_admit_no_more_than_the_limit(
    backend: str, request: pytest.FixtureRequest,
) -> None:
    """10 requests a second against 30 an hour while both workers are replaced twice,
    one after the other (at least 90 requests): 30 admitted."""
    storage_url = request.getfixturevalue(
        "redis_url" if backend == "redis" else "redis_cluster_url")
    env = {"RATELIMIT_STORAGE_URL": storage_url,
           "RATELIMIT_STORAGE_PREFIX": f"rlroll:{uuid.uuid4().hex[:12]}:",
           "RATELIMIT_STORAGE_TIMEOUT": "0.1",  # as in test_first_burst: a loaded host
           "RL_APP_LIMIT": str(LIMIT), "RL_APP_PERIOD": "hour"}
    replies: list[Reply] = []
    with uvicorn_server(env, workers=2) as base:
        manager = _manager(base)
        stop = asyncio.Event()
        # A new connection per request, so the kernel hands each to any live worker.
        traffic = asyncio.create_task(RawHTTP(base, connections=1).until(
            stop, ("/alg/sliding_window", {"connection": "close"}), replies,
            limit_s=600, pause=PAUSE))
        await asyncio.sleep(1.0)
        for _ in range(RESTARTS):
            await _replace_workers(manager)
            await asyncio.sleep(1.0)
        while len(replies) < 3 * LIMIT:  # 3 times the limit in all
            await asyncio.sleep(PAUSE)
        stop.set()
        await traffic
    answered = [reply for reply in replies if reply.status]
    assert len(answered) >= 3 * LIMIT, f"only {len(answered)} of {len(replies)} answered"
    admitted = [reply for reply in answered if reply.status == 200]
    assert len(admitted) == LIMIT
    assert {reply.headers["x-rl-source"] for reply in admitted} == {"storage"}
    assert {reply.status for reply in answered} == {200, 429}

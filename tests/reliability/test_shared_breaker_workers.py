"""A shared breaker across uvicorn workers: failures seen by one worker open it for all."""

from __future__ import annotations

import time
import uuid

import httpx
import pytest

from tests.redis_servers import RedisProcess, own_redis

from .servers import uvicorn_server

pytestmark = [pytest.mark.redis, pytest.mark.reliability, pytest.mark.slow]


@pytest.fixture
def redis_process() -> RedisProcess:
    with own_redis() as process:
        yield process


def _get(url: str, path: str) -> tuple[int, str]:
    """One request on a new connection (the kernel may hand it to any worker)."""
    with httpx.Client(base_url=url, timeout=5.0) as client:
        response = client.get(path, headers={"connection": "close"})
    return response.status_code, response.headers["x-worker-pid"]


def test_failures_seen_by_one_worker_open_the_breaker_of_both(
    redis_process: RedisProcess,
) -> None:
    """Two workers: the first to see three failures opens; then every request, whichever
    worker takes it, is refused with 503 (the other saw at most two failures, too few to
    open on its own)."""
    env = {"RL_APP_REDIS": f"redis://127.0.0.1:{redis_process.port}/0",
           "RL_APP_PREFIX": f"t{uuid.uuid4().hex[:8]}:"}
    with uvicorn_server(env, workers=2, app="tests.reliability.breaker_app:app") as url:
        failures: dict[str, int] = {}
        while max(failures.values(), default=0) < 3:  # the first worker to see 3 opens
            status, pid = _get(url, "/guarded/fail")
            assert status == 500, (status, failures)
            failures[pid] = failures.get(pid, 0) + 1
        time.sleep(0.5)  # ten sync intervals: the other worker has read the opening
        seen: dict[str, set[int]] = {}
        for _ in range(200):
            status, pid = _get(url, "/guarded/ok")
            seen.setdefault(pid, set()).add(status)
            if len(seen) == 2:
                break
        assert len(seen) == 2, seen  # both workers answered
        assert all(statuses == {503} for statuses in seen.values()), (failures, seen)

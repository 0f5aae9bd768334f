"""Two uvicorn processes on one real redis-server: a change made through one applies on
the other within a second, survives a Redis restart, and costs requests nothing."""

from __future__ import annotations

import shutil
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from tests.example_app.conftest import ExampleServer
from tests.redis_servers import RedisProcess

TOKEN = "multi-worker-admin-token-0123"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


def _persistent_redis(workdir: Path) -> RedisProcess:
    server = shutil.which("redis-server")
    if server is None:
        pytest.skip("redis-server is not installed")

    def command(directory: Path, port: int) -> list[str]:
        return [server, "--port", str(port), "--bind", "127.0.0.1", "--dir", str(directory),
                "--save", "", "--appendonly", "yes", "--appendfsync", "always"]
    return RedisProcess("persistent redis", workdir, command)


@pytest.fixture(scope="module")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisProcess]:
    server = _persistent_redis(tmp_path_factory.mktemp("overrides-redis"))
    server.start()
    yield server
    server.kill()


@pytest.fixture(scope="module")
def workers(redis_server: RedisProcess) -> Iterator[tuple[ExampleServer, ExampleServer]]:
    env = {"RATELIMIT_STORAGE_URL": f"redis://127.0.0.1:{redis_server.port}/0",
           "RATELIMIT_STORAGE_PREFIX": f"rlov:{uuid.uuid4().hex[:8]}:",
           "RATELIMIT_KEY": "api_key", "RATELIMIT_ADMIN_TOKEN": TOKEN,
           "RATELIMIT_STORAGE_TIMEOUT": "0.5",
           "RATELIMIT_EXEMPT_PATHS": "/health,/admin/ratelimit/{rest:path}"}
    started: list[ExampleServer] = []
    try:
        for _ in range(2):
            server = ExampleServer(env)
            server.command = [*server.command[:3], "tests.overrides.served_app:app",
                              *server.command[4:]]
            started.append(server.start())
        yield started[0], started[1]
    finally:
        for server in started:
            server.stop()


def _until(check: Callable[[], bool], timeout: float) -> float:
    """Seconds until ``check()`` holds (polled); fails after ``timeout``."""
    start = time.monotonic()
    while not check():
        if time.monotonic() - start > timeout:
            pytest.fail(f"not seen within {timeout} s")
        time.sleep(0.02)
    return time.monotonic() - start


def _limit(server: ExampleServer, key: str) -> str | None:
    response = httpx.get(f"{server.url}/hello", headers={"x-api-key": key}, timeout=5)
    return response.headers.get("x-ratelimit-limit")


def _put(server: ExampleServer, body: dict[str, object]) -> None:
    response = httpx.put(f"{server.url}/admin/ratelimit/overrides", json=body, headers=AUTH,
                         timeout=5)
    assert response.status_code == 200, response.text


def test_a_change_through_one_worker_applies_on_the_other_within_a_second(
        workers: tuple[ExampleServer, ExampleServer]) -> None:
    """Custom limits set through A are applied by B in under a second (measured)."""
    a, b = workers
    assert _limit(b, "acme") == "100"
    _put(a, {"caller": "api_key:acme", "limits": "7/minute", "plan": "acme"})
    assert _until(lambda: _limit(b, "acme") == "7", timeout=5) < 1.0
    assert _limit(a, "acme") == "7"
    quota = httpx.get(f"{b.url}/api/v1/account/quota", headers={"x-api-key": "acme"}).json()
    assert quota["plan"] == "acme" and quota["limits"] == {"requests_per_minute": 7}


def test_expiry_returns_the_caller_to_its_tier_on_both(
        workers: tuple[ExampleServer, ExampleServer]) -> None:
    """An override that expires gives the caller its tier back on every worker."""
    a, b = workers
    _put(a, {"caller": "api_key:trial", "tier": "pro", "expires_in": 2})
    _until(lambda: _limit(b, "trial") == "1000", timeout=1)
    assert _limit(a, "trial") == "1000"
    _until(lambda: _limit(a, "trial") == "100" and _limit(b, "trial") == "100", timeout=4)


def test_a_block_answers_429_with_retry_after_on_both(
        workers: tuple[ExampleServer, ExampleServer]) -> None:
    """A block set through A refuses on A and B, Retry-After pointing to its end."""
    a, b = workers
    _put(a, {"caller": "api_key:abuser", "block_for": 30})

    def refused(server: ExampleServer) -> httpx.Response:
        return httpx.get(f"{server.url}/hello", headers={"x-api-key": "abuser"})

    _until(lambda: refused(b).status_code == 429, timeout=1)
    for server in (a, b):
        response = refused(server)
        assert response.status_code == 429
        assert 28 <= int(response.headers["retry-after"]) <= 30
        assert response.json()["error"] == "blocked"


def test_ordinary_requests_cost_one_redis_command(
        redis_server: RedisProcess, workers: tuple[ExampleServer, ExampleServer]) -> None:
    """With overrides on, a request (overridden or not) is still one FCALL; the view's
    version polls are the only other calls, bounded by time, not by requests."""
    a, b = workers
    _put(a, {"caller": "api_key:counted", "limits": "1000/minute", "plan": "counted"})
    _until(lambda: _limit(b, "counted") == "1000", timeout=1)
    redis_server.call("CONFIG", "RESETSTAT")
    started = time.monotonic()
    count = 60
    with httpx.Client() as client:
        for i in range(count):
            server = (a, b)[i % 2]
            key = "counted" if i % 2 else f"plain-{i % 5}"  # with and without an override
            response = client.get(f"{server.url}/hello", headers={"x-api-key": key})
            assert response.status_code == 200
    elapsed = time.monotonic() - started
    stats = redis_server.info("commandstats")
    calls = {name.removeprefix("cmdstat_"): value["calls"] for name, value in stats.items()}
    assert calls.get("fcall", 0) == count, calls
    assert calls.get("hgetall", 0) == 0, calls  # no change, no reload
    # Two workers each read the version twice a second, whatever the traffic.
    assert calls.get("get", 0) <= 2 * (elapsed / 0.5 + 2), calls


def test_a_redis_restart_loses_no_override(
        redis_server: RedisProcess, workers: tuple[ExampleServer, ExampleServer]) -> None:
    """While Redis is down the known overrides stay in force; after its restart they
    are all there, and new changes propagate again."""
    a, b = workers
    _put(a, {"caller": "api_key:keep", "block_for": 60})
    _until(lambda: httpx.get(f"{b.url}/hello", headers={"x-api-key": "keep"}).status_code
           == 429, timeout=1)
    redis_server.kill()
    # Down: the block is still answered by both, from their local view.
    for server in (a, b):
        assert httpx.get(f"{server.url}/hello", headers={"x-api-key": "keep"}).status_code == 429
    redis_server.start()
    listed = httpx.get(f"{b.url}/admin/ratelimit/overrides", headers=AUTH).json()["overrides"]
    assert len([o for o in listed if o.get("blocked_until")]) >= 2
    _until(lambda: _limit(b, "acme") == "7", timeout=3)
    # The pub/sub link is back: a new change reaches B within a second again.
    _until(lambda: httpx.put(f"{a.url}/admin/ratelimit/overrides", headers=AUTH, json={
        "caller": "api_key:after", "tier": "pro"}).status_code == 200, timeout=5)
    assert _until(lambda: _limit(b, "after") == "1000", timeout=5) < 1.0


def test_a_counter_reset_through_one_worker_frees_the_caller_on_the_other(
        workers: tuple[ExampleServer, ExampleServer]) -> None:
    """Counters reset through A: B, which kept the caller's denial, admits it again."""
    a, b = workers
    _put(a, {"caller": "api_key:spent", "limits": "3/minute", "plan": "small"})
    _until(lambda: _limit(b, "spent") == "3", timeout=1)

    def status(server: ExampleServer) -> int:
        return httpx.get(f"{server.url}/hello", headers={"x-api-key": "spent"}).status_code

    _until(lambda: status(b) == 429, timeout=2)
    reset = httpx.post(f"{a.url}/admin/ratelimit/counters/api_key:spent/reset", headers=AUTH)
    assert reset.status_code == 200
    assert _until(lambda: status(b) == 200, timeout=5) < 1.0

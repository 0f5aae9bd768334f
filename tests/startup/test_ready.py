"""Ready before serving: the topology known, the scripts loaded and connections open when
start-up ends; a decision that finds a connection being made waits for it, within
``storage_connect_timeout``, while a connected storage keeps its per-decision timeout
and a storage that is down still fails open at once."""

from __future__ import annotations

import time

import httpx
import pytest

from ratelimit_mw.events import DecisionEvent
from ratelimit_mw.middleware import RateLimitMiddleware
from ratelimit_mw.storage.scripts import decide_library
from ratelimit_mw.storage.warmup import WARM_CONNECTIONS
from tests.conftest import free_port
from tests.redis_servers import ClusterDeployment, RedisProcess, SentinelDeployment, delayed
from tests.startup.conftest import AppFactory
from tests.startup.servers import lifespan

pytestmark = pytest.mark.redis

LIBRARY = decide_library().name


def _has_library(node: RedisProcess) -> bool:
    return bool(node.call("FUNCTION", "LIST", "LIBRARYNAME", LIBRARY))


def _clients(node: RedisProcess) -> int:
    return int(node.info("clients")["connected_clients"])


async def _get(app: RateLimitMiddleware, events: list[DecisionEvent]) -> tuple[int, str]:
    """One request through ``app``: its status and where its decision came from."""
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        status = (await client.get("/")).status_code
    return status, events[-1].source


@pytest.mark.slow  # needs the Cluster or Sentinel deployment
async def test_cluster_start_up_loads_every_primary_and_opens_connections(
    redis_cluster: ClusterDeployment, app_on: AppFactory, events: list[DecisionEvent],
) -> None:
    """After start-up every primary has the library and connections of ours, and the
    first request is decided by the cluster."""
    for node in redis_cluster.nodes:
        node.call("FUNCTION", "FLUSH")  # a throwaway cluster of this session's own
    before = [_clients(node) for node in redis_cluster.nodes]
    app = app_on(redis_cluster.url)
    async with lifespan(app) as answer:
        assert answer["type"] == "lifespan.startup.complete"
        assert all(_has_library(node) for node in redis_cluster.nodes)
        opened = [_clients(node) - count for node, count in zip(redis_cluster.nodes, before,
                                                                strict=True)]
        assert min(opened) >= WARM_CONNECTIONS, opened
        assert await _get(app, events) == (200, "storage")


@pytest.mark.slow  # needs the Cluster or Sentinel deployment
async def test_sentinel_start_up_finds_the_primary_and_loads_it(
    redis_sentinel: SentinelDeployment, app_on: AppFactory, events: list[DecisionEvent],
) -> None:
    """After start-up the primary Sentinel names has the library and a connection of ours."""
    redis_sentinel.wait_until_ready()
    primary = redis_sentinel.current_primary()
    primary.call("FUNCTION", "FLUSH")
    before = _clients(primary)
    app = app_on(redis_sentinel.url)
    async with lifespan(app) as answer:
        assert answer["type"] == "lifespan.startup.complete"
        assert _has_library(primary)
        assert _clients(primary) > before
        assert await _get(app, events) == (200, "storage")


async def test_a_decision_waits_for_the_connection_being_made(
    redis_url: str, app_on: AppFactory, events: list[DecisionEvent],
) -> None:
    """No start-up (no lifespan): the first decision waits for the connection (0.6 s of
    round trips, past the 50 ms per-decision timeout) and is Redis's; once connected,
    a decision as slow fails open after the per-decision timeout."""
    async with delayed(redis_url, 0.15) as slow_url:
        app = app_on(slow_url, storage_timeout=0.05, storage_connect_timeout=5)
        assert await _get(app, events) == (200, "storage")
        start = time.monotonic()
        assert await _get(app, events) == (200, "unavailable")
        assert time.monotonic() - start < 0.25
        await app.storage.close()


async def test_a_storage_that_is_down_fails_open_at_once(
    app_on: AppFactory, events: list[DecisionEvent],
) -> None:
    """Connection refused: no wait for the connect timeout, the failure policy answers."""
    app = app_on(f"redis://127.0.0.1:{free_port()}/0", storage_connect_timeout=5)
    start = time.monotonic()
    assert await _get(app, events) == (200, "unavailable")
    assert time.monotonic() - start < 1.0

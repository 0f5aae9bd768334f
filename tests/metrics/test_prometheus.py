"""The Prometheus metrics, fed by real apps behind the middleware (and real Redis)."""

from __future__ import annotations

import asyncio
import random
import string
from pathlib import Path

import pytest
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route

from ratelimit_mw import (
    ConfigError,
    Limit,
    MemoryStorage,
    RateLimitMiddleware,
    RateLimitSettings,
    RedisStorage,
    Tier,
)
from ratelimit_mw.metrics import PrometheusMetrics
from tests.conftest import FakeClock, free_port

from .conftest import app_with, client_for, label_values, value

DECISIONS = "ratelimit_decisions_total"


async def test_decisions_are_counted_by_tier_route_outcome_and_source() -> None:
    """Three allowed, two denied; the denials also by the policy that denied them."""
    metrics = PrometheusMetrics()
    app = app_with(metrics, tiers=[Tier("free", Limit("3/minute", name="per-minute"))])
    async with client_for(app) as client:
        codes = [(await client.get(f"/items/{i}")).status_code for i in range(5)]
    assert codes == [200, 200, 200, 429, 429]
    registry, labels = metrics.registry, {"tier": "free", "route": "/items/{id}"}
    assert value(registry, DECISIONS, **labels, outcome="allowed", source="storage") == 3
    assert value(registry, DECISIONS, **labels, outcome="denied", source="storage") == 2
    assert value(registry, "ratelimit_policy_denials_total", **labels, policy="per-minute",
                 outcome="denied") == 2


async def test_shadow_denials_are_counted_apart_and_let_through() -> None:
    metrics = PrometheusMetrics()
    app = app_with(metrics, tiers=[Tier("free", "1/minute")],
                   settings=RateLimitSettings(shadow=True))
    async with client_for(app) as client:
        codes = [(await client.get("/items/1")).status_code for _ in range(3)]
    assert codes == [200, 200, 200]
    labels = {"tier": "free", "route": "/items/{id}", "source": "storage"}
    assert value(metrics.registry, DECISIONS, **labels, outcome="allowed") == 1
    assert value(metrics.registry, DECISIONS, **labels, outcome="shadow_denied") == 2


async def test_a_scan_of_random_urls_leaves_the_route_labels_bounded() -> None:
    """Route labels are templates: hundreds of made-up paths add one label, 'unmatched'."""
    metrics = PrometheusMetrics()
    app = app_with(metrics, tiers=[Tier("free", "10000/minute")])
    scan = random.Random(7)
    async with client_for(app) as client:
        for _ in range(300):
            word = "".join(scan.choices(string.ascii_letters + string.digits, k=12))
            path = scan.choice([f"/items/{word}", f"/{word}", f"/{word}/{word}/x?q={word}"])
            await client.get(path)
    assert label_values(metrics.registry, DECISIONS, "route") == {"/items/{id}", "unmatched"}
    assert sum(value(metrics.registry, DECISIONS, tier="free", route=route, outcome="allowed",
                     source="storage") for route in ("/items/{id}", "unmatched")) == 300


async def test_a_storage_that_is_down_counts_errors_unavailable_and_the_open_breaker() -> None:
    """Redis on a port nobody listens on: each call fails (kind 'storage' or 'timeout'),
    the requests are undecided, and after three failures the storage breaker opens and
    refuses the rest without calling."""
    metrics = PrometheusMetrics()
    storage = RedisStorage.from_url(f"redis://127.0.0.1:{free_port()}/0")
    app = app_with(metrics, storage=storage, tiers=[Tier("free", "10/minute")],
                   settings=RateLimitSettings(failure_mode="open", storage_timeout=0.5))
    async with client_for(app) as client:
        codes = [(await client.get("/items/1")).status_code for _ in range(5)]
    await storage.close()
    registry = metrics.registry
    assert codes == [200] * 5
    assert value(registry, DECISIONS, tier="free", route="/items/{id}", outcome="unavailable",
                 source="unavailable") == 5
    errors = sum(value(registry, "ratelimit_storage_errors_total", kind=kind)
                 for kind in ("storage", "timeout", "other"))
    assert errors == 3 == value(registry, "ratelimit_storage_call_duration_seconds_count")
    breaker = {"breaker": "ratelimit-storage"}
    assert value(registry, "ratelimit_circuit_state", **breaker, state="open") == 1
    assert value(registry, "ratelimit_circuit_state", **breaker, state="closed") == 0
    assert value(registry, "ratelimit_circuit_transitions_total", **breaker,
                 from_state="closed", to_state="open") == 1
    assert value(registry, "ratelimit_circuit_refused_total", **breaker) == 2


@pytest.mark.redis
async def test_storage_latency_is_observed_once_per_decision_on_redis(
    redis_url: str, redis_prefix: str,
) -> None:
    metrics = PrometheusMetrics()
    storage = RedisStorage.from_url(redis_url, prefix=redis_prefix)
    # A roomy timeout: on a loaded host, 50 ms can pass and fail a decision open.
    app = app_with(metrics, storage=storage, tiers=[Tier("free", "100/minute")],
                   settings=RateLimitSettings(storage_timeout=5.0))
    async with client_for(app) as client:
        for _ in range(7):
            assert (await client.get("/items/1")).status_code == 200
    await storage.close()
    registry = metrics.registry
    assert value(registry, "ratelimit_storage_call_duration_seconds_count") == 7
    assert 0 < value(registry, "ratelimit_storage_call_duration_seconds_sum") < 7
    assert value(registry, "ratelimit_storage_errors_total", kind="storage") == 0


async def test_slots_in_flight_rise_while_requests_run_and_fall_after() -> None:
    metrics = PrometheusMetrics()
    started, finish = asyncio.Event(), asyncio.Event()

    async def slow(request: Request) -> Response:
        started.set()
        await finish.wait()
        return PlainTextResponse("done")

    app = app_with(metrics, [Route("/slow", slow)],
                   tiers=[Tier("pro", "100/minute", concurrency=5)])
    gauge = {"tier": "pro"}
    async with client_for(app) as client:
        running = asyncio.ensure_future(client.get("/slow"))
        await asyncio.wait_for(started.wait(), 5)
        assert value(metrics.registry, "ratelimit_slots_in_flight", **gauge) == 1
        finish.set()
        assert (await running).status_code == 200
    assert value(metrics.registry, "ratelimit_slots_in_flight", **gauge) == 0


async def test_a_slot_that_cannot_be_given_back_is_counted() -> None:
    """The storage fails the give-back: the failure is counted (the lease ends the slot)."""

    class NoRelease(MemoryStorage):
        def release_now(self, leases, on_error):  # type: ignore[no-untyped-def]
            raise ConnectionError("gone")

    metrics = PrometheusMetrics()
    app = app_with(metrics, storage=NoRelease(clock=FakeClock()),
                   tiers=[Tier("pro", "100/minute", concurrency=5)])
    async with client_for(app) as client:
        assert (await client.get("/items/1")).status_code == 200
    assert value(metrics.registry, "ratelimit_slot_release_failures_total") == 1
    assert value(metrics.registry, "ratelimit_slots_in_flight", tier="pro") == 0


def test_metrics_must_be_a_metrics_object() -> None:
    with pytest.raises(TypeError, match=r"metrics must be a ratelimit_mw\.metrics\.Metrics"):
        RateLimitMiddleware(app_with, metrics="prometheus")  # type: ignore[arg-type]


def test_without_metrics_nothing_is_reported() -> None:
    """Metrics off: no part of the middleware holds a reporter (nothing runs for it)."""
    middleware = RateLimitMiddleware(app_with, tiers=[Tier("free", "1/minute")])
    assert middleware.limiter.guarded.metrics is None
    assert middleware.limiter._on_decision is None


def test_a_multiprocess_directory_that_does_not_exist_fails_at_start_up(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    missing = f"{tmp_path}/nowhere"
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", missing)
    with pytest.raises(ConfigError, match="nowhere' is not a directory"):
        PrometheusMetrics()

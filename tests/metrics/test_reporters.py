"""Breakers, idempotency and the retry transport report to the Prometheus metrics."""

from __future__ import annotations

import asyncio
import contextlib

import httpx

from ratelimit_mw.breaker import CircuitBreaker
from ratelimit_mw.client import RetryPolicy, RetryTransport, set_testing
from ratelimit_mw.idempotency import MemoryIdempotencyStore
from ratelimit_mw.metrics import PrometheusMetrics
from tests.conftest import FakeClock
from tests.idempotency.conftest import Orders

from .conftest import value


async def _fail() -> None:
    raise ConnectionError("down")


async def test_a_watched_breaker_reports_its_state_transitions_and_refusals() -> None:
    metrics, clock = PrometheusMetrics(), FakeClock()
    breaker = CircuitBreaker(name="upstream", window_size=2, minimum_calls=2, cooldown=5,
                             clock=clock)
    metrics.watch(breaker)
    named = {"breaker": "upstream"}
    assert value(metrics.registry, "ratelimit_circuit_state", **named, state="closed") == 1
    for _ in range(2):
        with contextlib.suppress(ConnectionError):
            await breaker.call(_fail)
    assert breaker.try_acquire() is None
    assert breaker.try_acquire() is None
    clock.advance(5)
    permit = breaker.try_acquire()
    assert permit is not None
    permit.record_success()
    registry = metrics.registry
    assert value(registry, "ratelimit_circuit_refused_total", **named) == 2
    assert [value(registry, "ratelimit_circuit_transitions_total", **named, from_state=old,
                  to_state=new) for old, new in [("closed", "open"), ("open", "half_open"),
                                                 ("half_open", "closed")]] == [1, 1, 1]
    assert value(registry, "ratelimit_circuit_state", **named, state="closed") == 1
    assert value(registry, "ratelimit_circuit_state", **named, state="open") == 0


async def test_idempotency_replays_conflicts_and_mismatches_are_counted() -> None:
    metrics, orders = PrometheusMetrics(), Orders()
    app = orders.app(MemoryIdempotencyStore(), metrics=metrics)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        key = {"Idempotency-Key": "k-1"}
        assert (await client.post("/orders", content=b"a", headers=key)).status_code == 201
        replayed = await client.post("/orders", content=b"a", headers=key)
        assert replayed.headers["x-idempotent-replayed"] == "true"
        assert (await client.post("/orders", content=b"b", headers=key)).status_code == 422
        orders.gate.clear()
        running = asyncio.ensure_future(
            client.post("/orders", content=b"c", headers={"Idempotency-Key": "k-2"}))
        while orders.runs["create"] < 2:
            await asyncio.sleep(0.005)
        second = await client.post("/orders", content=b"c", headers={"Idempotency-Key": "k-2"})
        assert second.status_code == 409
        orders.gate.set()
        assert (await running).status_code == 201
    counted = {event: value(metrics.registry, "ratelimit_idempotency_events_total", event=event)
               for event in ("replay", "conflict", "mismatch", "store_failure")}
    assert counted == {"replay": 1, "conflict": 1, "mismatch": 1, "store_failure": 0}


async def test_the_retry_transport_counts_attempts_retries_sleep_and_give_ups() -> None:
    """Two 429s with Retry-After 2, then a 200; then three 503s and give up at
    max_retries: every count labelled by host alone."""
    replies = iter([429, 429, 200, 503, 503, 503])

    def answer(request: httpx.Request) -> httpx.Response:
        status = next(replies)
        return httpx.Response(status, headers={"Retry-After": "2"} if status == 429 else {})

    metrics = PrometheusMetrics()
    transport = RetryTransport(httpx.MockTransport(answer), metrics=metrics,
                               policy=RetryPolicy(max_retries=2))
    set_testing(True)
    try:
        async with httpx.AsyncClient(transport=transport) as client:
            assert (await client.get("https://api.example.org/a?x=1")).status_code == 200
            assert (await client.get("https://api.example.org/b")).status_code == 503
    finally:
        set_testing(False)
    host = {"host": "api.example.org"}
    registry = metrics.registry
    assert value(registry, "ratelimit_client_attempts_total", **host) == 6
    assert value(registry, "ratelimit_client_retries_total", **host, cause="429") == 2
    assert value(registry, "ratelimit_client_retries_total", **host, cause="503") == 2
    assert value(registry, "ratelimit_client_sleep_seconds_total", **host) >= 4
    assert value(registry, "ratelimit_client_give_ups_total", **host, reason="max_retries") == 1

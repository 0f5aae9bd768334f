"""The OpenTelemetry metrics, read with the SDK's in-memory reader."""

from __future__ import annotations

from typing import Any

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from ratelimit_mw import Limit, Tier
from ratelimit_mw.breaker import CircuitBreaker
from ratelimit_mw.metrics import OTelMetrics
from tests.conftest import FakeClock

from .conftest import app_with, client_for


def points(reader: InMemoryMetricReader) -> dict[str, list[tuple[dict[str, Any], Any]]]:
    """Each metric's data points as (attributes, value or histogram count)."""
    data = reader.get_metrics_data()
    assert data is not None
    found: dict[str, list[tuple[dict[str, Any], Any]]] = {}
    for resource in data.resource_metrics:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                found[metric.name] = [
                    (dict(point.attributes or {}),
                     getattr(point, "value", None) if hasattr(point, "value") else point.count)
                    for point in metric.data.data_points]
    return found


def made() -> tuple[OTelMetrics, InMemoryMetricReader]:
    reader = InMemoryMetricReader()
    return OTelMetrics(MeterProvider(metric_readers=[reader])), reader


async def test_decisions_and_denials_reach_the_meter() -> None:
    metrics, reader = made()
    app = app_with(metrics, tiers=[Tier("free", Limit("2/minute", name="per-minute"))])
    async with client_for(app) as client:
        codes = [(await client.get("/items/7")).status_code for _ in range(4)]
    assert codes == [200, 200, 429, 429]
    found = points(reader)
    route = {"tier": "free", "route": "/items/{id}", "source": "storage"}
    assert sorted(found["ratelimit_decisions"], key=str) == sorted([
        ({**route, "outcome": "allowed"}, 2), ({**route, "outcome": "denied"}, 2)], key=str)
    assert found["ratelimit_policy_denials"] == [
        ({"tier": "free", "route": "/items/{id}", "policy": "per-minute",
          "outcome": "denied"}, 2)]


async def test_breaker_states_transitions_and_refusals_reach_the_meter() -> None:
    metrics, reader = made()
    clock = FakeClock()
    breaker = CircuitBreaker(name="db", window_size=1, minimum_calls=1, cooldown=5,
                             clock=clock)
    metrics.watch(breaker)
    permit = breaker.try_acquire()
    assert permit is not None
    permit.record_failure()
    assert breaker.try_acquire() is None
    found = points(reader)
    states = {point[0]["state"]: point[1] for point in found["ratelimit_circuit_state"]}
    assert states == {"closed": 0, "open": 1}
    assert found["ratelimit_circuit_transitions"] == [
        ({"breaker": "db", "from_state": "closed", "to_state": "open"}, 1)]
    assert found["ratelimit_circuit_refused"] == [({"breaker": "db"}, 1)]


async def test_slots_and_client_events_reach_the_meter() -> None:
    metrics, reader = made()
    metrics.slots_in_flight("pro", 2)
    metrics.slots_in_flight("pro", -1)
    metrics.storage_call(0.003)
    metrics.client_retry("api.example.org", "429", 1.5)
    found = points(reader)
    assert found["ratelimit_slots_in_flight"] == [({"tier": "pro"}, 1)]
    assert found["ratelimit_storage_call_duration_seconds"] == [({}, 1)]
    assert found["ratelimit_client_sleep_seconds"] == [({"host": "api.example.org"}, 1.5)]

"""One table of instruments that both backends make, the same way; the OTel backend
without prometheus_client; storage calls counted on every path."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from redis import exceptions as redis_errors

from ratelimit_mw import Limit, MemoryStorage, Tier
from ratelimit_mw.errors import StorageError
from ratelimit_mw.metrics import INSTRUMENTS, OTelMetrics, PrometheusMetrics, error_kind

from .conftest import app_with, client_for, value


def test_prometheus_makes_every_instrument_of_the_table_as_written() -> None:
    """Each instrument is in the Prometheus registry under its name, type, help text
    and labels from ``INSTRUMENTS``."""
    metrics = PrometheusMetrics()
    kinds = {"counter": "counter", "gauge": "gauge", "histogram": "histogram"}
    families = {family.name: family for family in metrics.registry.collect()}
    for instrument in INSTRUMENTS.values():
        family = families[f"ratelimit_{instrument.name}".removesuffix("_total")]
        assert family.type == kinds[instrument.kind], instrument.name
        assert family.documentation == instrument.help, instrument.name


def test_otel_makes_every_instrument_of_the_table_as_written() -> None:
    """Each instrument reaches the meter under its name, help text and unit; counters
    and histograms as such, gauges as up-down counters."""
    made: dict[str, dict[str, Any]] = {}

    class Meter:
        def __getattr__(self, kind: str) -> Any:
            def create(name: str, **options: Any) -> object:
                made[name] = {"kind": kind, **options}
                return object()
            return create

    class Provider:
        def get_meter(self, *args: Any, **kwargs: Any) -> Meter:
            return Meter()

    OTelMetrics(Provider())
    kinds = {"counter": "create_counter", "gauge": "create_up_down_counter",
             "histogram": "create_histogram"}
    assert set(made) == {f"ratelimit_{name}" for name in INSTRUMENTS}
    for instrument in INSTRUMENTS.values():
        options = made[f"ratelimit_{instrument.name}"]
        assert options["kind"] == kinds[instrument.kind], instrument.name
        assert options["description"] == instrument.help
        assert options["unit"] == instrument.unit
        if instrument.buckets:
            assert options["explicit_bucket_boundaries_advisory"] == list(instrument.buckets)


OTEL_ALONE = """
import asyncio, importlib.abc, sys

class NoPrometheus(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name == "prometheus_client" or name.startswith("prometheus_client."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, NoPrometheus())
import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from redis import exceptions as redis_errors
from ratelimit_mw.metrics import OTelMetrics

reader = InMemoryMetricReader()
metrics = OTelMetrics(MeterProvider(metric_readers=[reader]))
metrics.storage_error("timeout")
names = [m.name for r in reader.get_metrics_data().resource_metrics
         for s in r.scope_metrics for m in s.metrics]
try:
    from ratelimit_mw.metrics import PrometheusMetrics
except ImportError as exc:
    print(names, "prometheus:", exc)
"""


def test_otel_metrics_work_without_prometheus_client() -> None:
    """With prometheus_client not importable, ``OTelMetrics`` imports and counts, and
    ``PrometheusMetrics`` says which extra to install."""
    run = subprocess.run([sys.executable, "-c", OTEL_ALONE], capture_output=True, text=True,
                         timeout=60, check=False)
    assert run.returncode == 0, run.stderr
    assert run.stdout.startswith("['ratelimit_storage_errors']"), run.stdout
    assert "pip install 'ratelimit_mw[prometheus]'" in run.stdout


async def test_decisions_made_without_awaiting_are_counted_untimed() -> None:
    """The memory storage decides without awaiting: each of those storage calls is
    counted (not timed: timing it would cost more than the call), on both backends,
    and the histogram of awaited calls stays empty."""
    prometheus = PrometheusMetrics()
    app = app_with(prometheus, tiers=[Tier("free", Limit("5/minute"))], storage=MemoryStorage())
    async with client_for(app) as client:
        for i in range(3):
            assert (await client.get(f"/items/{i}")).status_code == 200
    registry = prometheus.registry
    assert value(registry, "ratelimit_storage_calls_in_place_total") == 3
    assert value(registry, "ratelimit_storage_call_duration_seconds_count") == 0

    reader = InMemoryMetricReader()
    otel = OTelMetrics(MeterProvider(metric_readers=[reader]))
    app = app_with(otel, tiers=[Tier("free", Limit("5/minute"))], storage=MemoryStorage())
    async with client_for(app) as client:
        for i in range(3):
            await client.get(f"/items/{i}")
    data = reader.get_metrics_data()
    assert data is not None
    counted = [point.value for r in data.resource_metrics for s in r.scope_metrics
               for m in s.metrics if m.name == "ratelimit_storage_calls_in_place"
               for point in m.data.data_points]
    assert counted == [3]


def _raised_from(cause: BaseException) -> StorageError:
    """A storage's error raised from ``cause``, as RedisStorage raises them."""
    try:
        try:
            raise cause
        except BaseException as exc:
            raise StorageError(f"redis could not decide: {exc}") from exc
    except StorageError as error:
        return error


@pytest.mark.parametrize(("cause", "kind"), [
    (TimeoutError("redis did not answer within the timeout"), "timeout"),
    (redis_errors.TimeoutError("Timeout reading from 10.0.0.5:6379"), "timeout"),
    (redis_errors.ResponseError(
        "OOM command not allowed when used memory > 'maxmemory'. script: abc"), "oom"),
    (redis_errors.OutOfMemoryError("command not allowed when used memory > 'maxmemory'."),
     "oom"),
    (redis_errors.ConnectionError("Connection refused"), "storage"),
])
def test_a_storage_error_is_counted_by_its_cause(cause: BaseException, kind: str) -> None:
    """The kind of a failed call follows the cause its StorageError was raised from: a
    Redis timeout is a ``timeout``, a full Redis ``oom``, not both ``storage``."""
    assert error_kind(_raised_from(cause)) == kind
    assert error_kind(ValueError("a bug")) == "other"

"""The example app's metrics under real uvicorn workers, scraped by a real Prometheus."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import free_port
from tests.example_app.conftest import FREE, ROOT, ExampleServer

pytestmark = pytest.mark.slow

DASHBOARD = ROOT / "deploy" / "grafana" / "dashboards" / "ratelimit.json"
# Grafana's own variables in the dashboard's queries, as Grafana would fill them in.
GRAFANA_VARIABLES = {"$__rate_interval": "1m", "$__range": "5m", "$__interval": "15s"}


def exported(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample ``url``/metrics serves, by name and labels."""
    text = httpx.get(f"{url}/metrics").text
    return {(sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in text_string_to_metric_families(text) for sample in family.samples}


def total(samples: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str,
          **labels: str) -> float:
    return sum(value for (found, pairs), value in samples.items()
               if found == name and labels.items() <= dict(pairs).items())


def drive(url: str, requests: int) -> tuple[int, int, set[int]]:
    """``requests`` anonymous hellos, each on a new connection (so any worker may take
    it): the 200s, the 429s, and the workers that answered."""
    allowed = denied = 0
    workers: set[int] = set()
    for _ in range(requests):
        response = httpx.get(f"{url}/api/v1/hello", headers={"connection": "close"})
        if response.status_code == 200:
            allowed += 1
            workers.add(response.json()["worker"])
        else:
            assert response.status_code == 429
            denied += 1
    return allowed, denied, workers


@pytest.fixture
def two_workers(tmp_path: Path) -> Iterator[ExampleServer]:
    """The example app on two uvicorn workers in Prometheus multiprocess mode."""
    directory = tmp_path / "metrics"
    directory.mkdir()
    server = ExampleServer({"PROMETHEUS_MULTIPROC_DIR": str(directory)}, workers=2).start()
    try:
        yield server
    finally:
        server.stop()


def test_two_workers_report_the_exact_sum_of_their_counts(
        two_workers: ExampleServer) -> None:
    """Forty requests over two workers (each with its own in-memory limits): /metrics
    counts forty decisions, and exactly the denials the client saw."""
    allowed, denied, workers = drive(two_workers.url, 40)
    assert len(workers) == 2, "one worker took every request; nothing summed"
    samples = exported(two_workers.url)
    decisions = "ratelimit_decisions_total"
    assert total(samples, decisions) == 40
    assert total(samples, decisions, outcome="denied") == denied
    assert total(samples, decisions, outcome="allowed") == allowed
    assert total(samples, decisions, route="/api/v1/hello", tier="anonymous") == 40


class Prometheus:
    """A prometheus server of the test's own, scraping ``target`` every half second."""

    def __init__(self, target: str, workdir: Path) -> None:
        binary = shutil.which("prometheus")
        if binary is None:
            message = "prometheus is not installed (scripts/test installs it)"
            if os.environ.get("CI"):
                pytest.fail(message)
            pytest.skip(message)
        config = workdir / "prometheus.yml"
        config.write_text(json.dumps({  # JSON is YAML
            "global": {"scrape_interval": "500ms", "scrape_timeout": "400ms"},
            "scrape_configs": [{"job_name": "example", "metrics_path": "/metrics",
                                "static_configs": [{"targets": [target]}]}]}))
        self.url = f"http://127.0.0.1:{free_port()}"
        self.log = (workdir / "prometheus.log").open("wb")
        self.proc = subprocess.Popen(
            [binary, f"--config.file={config}", f"--storage.tsdb.path={workdir / 'data'}",
             f"--web.listen-address={self.url.removeprefix('http://')}"],
            stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + 60
        while not self._ready():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                pytest.fail(f"prometheus did not start:\n{self.output(workdir)}")
            time.sleep(0.2)

    def _ready(self) -> bool:
        try:
            return httpx.get(f"{self.url}/-/ready", timeout=1).status_code == 200
        except httpx.TransportError:
            return False

    def output(self, workdir: Path) -> str:
        return (workdir / "prometheus.log").read_text()[-3000:]

    def query(self, expr: str) -> list[dict[str, Any]]:
        """The result of an instant query; fails on any error Prometheus reports."""
        reply = httpx.get(f"{self.url}/api/v1/query", params={"query": expr}, timeout=10)
        body = reply.json()
        assert reply.status_code == 200 and body["status"] == "success", (expr, body)
        result: list[dict[str, Any]] = body["data"]["result"]
        return result

    def scalar(self, expr: str) -> float | None:
        result = self.query(expr)
        return float(result[0]["value"][1]) if result else None

    def metric_names(self) -> set[str]:
        reply = httpx.get(f"{self.url}/api/v1/label/__name__/values", timeout=10).json()
        return set(reply["data"])

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)
        self.log.close()


@pytest.fixture
def prometheus(two_workers: ExampleServer, tmp_path: Path) -> Iterator[Prometheus]:
    server = Prometheus(f"127.0.0.1:{two_workers.port}", tmp_path)
    try:
        yield server
    finally:
        server.stop()


def settled(prometheus: Prometheus, expr: str, expected: float) -> float | None:
    """``expr`` once it reads ``expected`` (scrapes come every half second), or what it
    last read after 30 seconds."""
    deadline = time.monotonic() + 30
    while True:
        found = prometheus.scalar(expr)
        if found == expected or time.monotonic() > deadline:
            return found
        time.sleep(0.25)


def test_prometheus_counts_exactly_the_denials_the_client_saw(
        two_workers: ExampleServer, prometheus: Prometheus) -> None:
    """A real Prometheus scrapes the app on two workers; its denial count is exact."""
    allowed, denied, _ = drive(two_workers.url, 24)
    assert denied > 0
    expr = 'sum(ratelimit_decisions_total{outcome="denied",route="/api/v1/hello"})'
    assert settled(prometheus, expr, denied) == denied
    assert settled(prometheus, 'sum(ratelimit_decisions_total{outcome="allowed"})',
                   allowed) == allowed
    assert settled(prometheus, 'sum(ratelimit_policy_denials_total{policy="per-minute"})',
                   denied) == denied


def _queries(dashboard: dict[str, Any]) -> list[tuple[str, str]]:
    return [(panel["title"], target["expr"]) for panel in dashboard["panels"]
            for target in panel.get("targets", [])]


def test_every_dashboard_query_runs_and_names_only_exported_metrics(
        two_workers: ExampleServer, prometheus: Prometheus) -> None:
    """Each query of the Grafana dashboard, run against Prometheus scraping the app,
    succeeds and names only metrics Prometheus has."""
    dashboard = json.loads(DASHBOARD.read_text())
    titles = {panel["title"] for panel in dashboard["panels"]}
    assert {"Requests by tier and route", "Denials by tier and route", "Top denied policies",
            "Storage latency p50 / p99", "Breaker states",
            "Concurrency slots in flight"} <= titles
    drive(two_workers.url, 12)  # denials: the decisions and policy denials series
    for _ in range(2):  # a tier with concurrency: the slots series
        assert httpx.get(f"{two_workers.url}/api/v1/hello", headers=FREE).status_code == 200
    assert settled(prometheus, "count(ratelimit_slots_in_flight)", 1) == 1
    names = prometheus.metric_names()
    for title, expr in _queries(dashboard):
        for variable, filled in GRAFANA_VARIABLES.items():
            expr = expr.replace(variable, filled)
        used = set(re.findall(r"\bratelimit_[a-z_]+", expr))
        assert used, (title, expr)
        assert used <= names, (title, used - names)
        prometheus.query(expr)

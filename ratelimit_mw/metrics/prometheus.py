"""The events as Prometheus metrics (``prometheus_client``, extra ``prometheus``).

With ``PROMETHEUS_MULTIPROC_DIR`` set (before the first import of prometheus_client),
every worker writes its values to files there and ``metrics_endpoint`` serves the sum
over the workers: prometheus_client's multiprocess mode.
"""

from __future__ import annotations

import os
from collections.abc import Hashable
from typing import Any

try:
    from prometheus_client import (
        CONTENT_TYPE_LATEST,
        CollectorRegistry,
        Counter,
        Gauge,
        Histogram,
        generate_latest,
    )
    from prometheus_client.multiprocess import MultiProcessCollector, mark_process_dead
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    msg = "PrometheusMetrics needs prometheus_client: pip install 'ratelimit_mw[prometheus]'"
    raise ImportError(msg) from exc

from starlette.requests import Request
from starlette.responses import Response

from ..breaker import CircuitState
from ..errors import ConfigError
from ..events import DecisionEvent
from .instruments import (
    ERROR_KINDS,
    IDEMPOTENCY_EVENTS,
    INSTRUMENTS,
    UNMATCHED_ROUTE,
    ErrorKind,
    IdempotencyEvent,
    Metrics,
    outcome_of,
    policy_of,
)
from .tally import Tally

__all__ = ["PrometheusMetrics"]



class PrometheusMetrics(Metrics):
    """Counts ratelimit_mw's events as Prometheus metrics in ``registry`` (a registry of
    its own by default, served by ``metrics_endpoint``).

    >>> from ratelimit_mw.metrics import PrometheusMetrics
    >>> metrics = PrometheusMetrics()
    >>> # RateLimitMiddleware(app, metrics=metrics); app.add_route("/metrics", metrics.endpoint)
    """

    __slots__ = ("_children", "_circuit", "_circuit_refused", "_circuit_transitions",
                 "_client_attempts", "_client_give_ups", "_client_retries", "_client_sleep",
                 "_decisions", "_denials", "_held", "_hold_seconds", "_holds_given_up",
                 "_idempotency", "_in_place", "_settle_failures",
                 "_slot_failures", "_slots", "_storage_errors", "_storage_seconds", "_ws_refused",
                 "registry")

    def __init__(self, registry: CollectorRegistry | None = None,
                 namespace: str = "ratelimit") -> None:
        directory = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
        if directory and not os.path.isdir(directory):
            msg = (f"PROMETHEUS_MULTIPROC_DIR={directory!r} is not a directory; create it "
                   f"(empty) before the workers start, or unset it for one process")
            raise ConfigError(msg)
        self.registry = registry if registry is not None else CollectorRegistry()

        kinds = {"counter": Counter, "gauge": Gauge, "histogram": Histogram}

        def make(name: str) -> Any:
            instrument = INSTRUMENTS[name]
            options: dict[str, Any] = {}
            if instrument.kind == "gauge":
                options["multiprocess_mode"] = "livesum"
            if instrument.buckets:
                options["buckets"] = instrument.buckets
            return kinds[instrument.kind](
                instrument.name, instrument.help, instrument.labels, namespace=namespace,
                registry=self.registry, **options)

        def per_request(name: str) -> Any:
            # Counted per request: as plain numbers, unless the workers share files.
            if _multiprocess():
                return make(name)
            instrument = INSTRUMENTS[name]
            return Tally(f"{namespace}_{name}", instrument.help, instrument.labels,
                         self.registry)

        self._decisions = per_request("decisions")
        self._denials = make("policy_denials")
        self._storage_seconds = make("storage_call_duration_seconds")
        in_place = per_request("storage_calls_in_place")
        self._in_place = in_place.labels_cell() if isinstance(in_place, Tally) else in_place
        self._storage_errors = make("storage_errors")
        self._slots = make("slots_in_flight")
        self._slot_failures = make("slot_release_failures")
        self._settle_failures = make("settlement_failures")
        self._ws_refused = make("websocket_messages_refused")
        self._held = make("held_requests")
        self._hold_seconds = make("hold_seconds")
        self._holds_given_up = make("holds_given_up")
        self._circuit = make("circuit_state")
        self._circuit_transitions = make("circuit_transitions")
        self._circuit_refused = make("circuit_refused")
        self._idempotency = make("idempotency_events")
        self._client_attempts = make("client_attempts")
        self._client_retries = make("client_retries")
        self._client_sleep = make("client_sleep_seconds")
        self._client_give_ups = make("client_give_ups")
        # Label children by their label values: labels() costs several times an inc().
        self._children: dict[Hashable, Any] = {}
        # Series of the known label values exist from the start, at 0 (an alert on them
        # works before the first event; rate() sees the first one).
        for kind in ERROR_KINDS:
            self._child(self._storage_errors, kind)
        for event in IDEMPOTENCY_EVENTS:
            self._child(self._idempotency, event)

    def _decision_count(self, *values: str) -> Any:
        decisions = self._decisions
        if isinstance(decisions, Tally):
            return decisions.labels_cell(*values)
        return decisions.labels(*values)

    def _child(self, metric: Any, *values: str) -> Any:
        key = (id(metric), *values)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(*values)
        return child

    def decision(self, event: DecisionEvent) -> None:
        # The per-request path: one look-up by what sets the labels (a storage that is
        # down is the only source without a verdict), then the count.
        key = (event.tier, event.route, event.source, event.refused, event.shadow)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = self._decision_count(
                event.tier, event.route or UNMATCHED_ROUTE, outcome_of(event), event.source)
        child.inc()
        if (event.refused or event.shadow) and event.verdict is not None:
            self._child(self._denials, event.tier, event.route or UNMATCHED_ROUTE,
                        policy_of(event), outcome_of(event)).inc()

    def storage_call(self, seconds: float) -> None:
        self._storage_seconds.observe(seconds)

    def storage_call_in_place(self) -> None:
        self._in_place.inc()

    def storage_error(self, kind: ErrorKind) -> None:
        self._child(self._storage_errors, kind).inc()

    def slots_in_flight(self, tier: str, change: int) -> None:
        self._child(self._slots, tier).inc(change)

    def slot_release_failed(self, count: int) -> None:
        self._slot_failures.inc(count)

    def settlement_failed(self, count: int) -> None:
        self._settle_failures.inc(count)

    def websocket_message_refused(self, limit: str, action: str) -> None:
        self._child(self._ws_refused, limit, action).inc()

    def held(self, tier: str, change: int) -> None:
        self._child(self._held, tier).inc(change)

    def waited(self, tier: str, seconds: float) -> None:
        self._child(self._hold_seconds, tier).observe(seconds)

    def hold_given_up(self, reason: str) -> None:
        self._child(self._holds_given_up, reason).inc()

    def circuit_state(self, breaker: str, old: CircuitState | None,
                      new: CircuitState) -> None:
        if old is None:
            for state in CircuitState:
                self._child(self._circuit, breaker, state.value).set(0)
        else:
            self._child(self._circuit, breaker, old.value).set(0)
            self._child(self._circuit_transitions, breaker, old.value, new.value).inc()
        self._child(self._circuit, breaker, new.value).set(1)
        self._child(self._circuit_refused, breaker)  # from 0, for rate()

    def circuit_refused(self, breaker: str) -> None:
        self._child(self._circuit_refused, breaker).inc()

    def idempotency(self, event: IdempotencyEvent) -> None:
        self._child(self._idempotency, event).inc()

    def client_attempt(self, host: str) -> None:
        self._child(self._client_attempts, host).inc()

    def client_retry(self, host: str, cause: str, wait: float) -> None:
        self._child(self._client_retries, host, cause).inc()
        self._child(self._client_sleep, host).inc(wait)

    def client_give_up(self, host: str, reason: str) -> None:
        self._child(self._client_give_ups, host, reason).inc()

    def exposition(self) -> bytes:
        """The metrics in Prometheus's text format: this process's, or in multiprocess
        mode the sum over every worker's."""
        if _multiprocess():
            registry = CollectorRegistry()
            MultiProcessCollector(registry)  # type: ignore[no-untyped-call]
            return generate_latest(registry)
        return generate_latest(self.registry)

    def process_exited(self) -> None:
        """In multiprocess mode, drop this worker's live gauges (slots in flight, breaker
        states) from the sum: call it when the worker shuts down."""
        if _multiprocess():
            mark_process_dead(os.getpid())  # type: ignore[no-untyped-call]

    async def endpoint(self, request: Request) -> Response:
        """A Starlette endpoint serving ``exposition()`` (``app.add_route("/metrics",
        metrics.endpoint)``)."""
        return Response(self.exposition(), media_type=CONTENT_TYPE_LATEST)


def _multiprocess() -> bool:
    """Whether prometheus_client writes its values to the workers' shared files."""
    return bool(os.environ.get("PROMETHEUS_MULTIPROC_DIR"))

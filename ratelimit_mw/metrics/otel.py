"""The events as OpenTelemetry metrics (``opentelemetry-api``, extra ``otel``).

The instruments are those of ``INSTRUMENTS``, as the Prometheus implementation makes
them (names without ``_total``, which OTel exporters add; the same attributes), so one
dashboard reads either.
"""

from __future__ import annotations

from typing import Any

try:
    from opentelemetry import metrics as otel
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    msg = "OTelMetrics needs opentelemetry-api: pip install 'ratelimit_mw[otel]'"
    raise ImportError(msg) from exc

from ..breaker import CircuitState
from ..events import DecisionEvent
from .instruments import (
    INSTRUMENTS,
    UNMATCHED_ROUTE,
    ErrorKind,
    IdempotencyEvent,
    Metrics,
    outcome_of,
    policy_of,
)

__all__ = ["OTelMetrics"]


class OTelMetrics(Metrics):
    """Counts ratelimit_mw's events with a meter of ``meter_provider`` (the global one
    by default); the exporter is the application's own."""

    __slots__ = ("_circuit", "_circuit_refused", "_circuit_transitions", "_client_attempts",
                 "_client_give_ups", "_client_retries", "_client_sleep", "_decisions", "_denials",
                 "_held", "_hold_seconds", "_holds_given_up", "_idempotency", "_in_place",
                 "_settle_failures", "_slot_failures", "_slots", "_storage_errors",
                 "_storage_seconds", "_ws_refused")

    def __init__(self, meter_provider: Any = None, prefix: str = "ratelimit") -> None:
        meter = otel.get_meter("ratelimit_mw", meter_provider=meter_provider)

        def make(name: str) -> Any:
            instrument = INSTRUMENTS[name]
            full = f"{prefix}_{instrument.name}"
            if instrument.kind == "histogram":
                return meter.create_histogram(
                    full, unit=instrument.unit, description=instrument.help,
                    explicit_bucket_boundaries_advisory=list(instrument.buckets))
            create = (meter.create_up_down_counter if instrument.kind == "gauge"
                      else meter.create_counter)
            return create(full, unit=instrument.unit, description=instrument.help)

        self._decisions = make("decisions")
        self._denials = make("policy_denials")
        self._storage_seconds = make("storage_call_duration_seconds")
        self._in_place = make("storage_calls_in_place")
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

    def decision(self, event: DecisionEvent) -> None:
        route = event.route or UNMATCHED_ROUTE
        outcome = outcome_of(event)
        self._decisions.add(1, {"tier": event.tier, "route": route, "outcome": outcome,
                                "source": event.source})
        if outcome in ("denied", "shadow_denied"):
            self._denials.add(1, {"tier": event.tier, "route": route,
                                  "policy": policy_of(event), "outcome": outcome})

    def storage_call(self, seconds: float) -> None:
        self._storage_seconds.record(seconds)

    def storage_call_in_place(self) -> None:
        self._in_place.add(1)

    def storage_error(self, kind: ErrorKind) -> None:
        self._storage_errors.add(1, {"kind": kind})

    def slots_in_flight(self, tier: str, change: int) -> None:
        self._slots.add(change, {"tier": tier})

    def slot_release_failed(self, count: int) -> None:
        self._slot_failures.add(count)

    def settlement_failed(self, count: int) -> None:
        self._settle_failures.add(count)

    def websocket_message_refused(self, limit: str, action: str) -> None:
        self._ws_refused.add(1, {"limit": limit, "action": action})

    def held(self, tier: str, change: int) -> None:
        self._held.add(change, {"tier": tier})

    def waited(self, tier: str, seconds: float) -> None:
        self._hold_seconds.record(seconds, {"tier": tier})

    def hold_given_up(self, reason: str) -> None:
        self._holds_given_up.add(1, {"reason": reason})

    def circuit_state(self, breaker: str, old: CircuitState | None,
                      new: CircuitState) -> None:
        if old is not None:
            self._circuit.add(-1, {"breaker": breaker, "state": old.value})
            self._circuit_transitions.add(1, {"breaker": breaker, "from_state": old.value,
                                              "to_state": new.value})
        self._circuit.add(1, {"breaker": breaker, "state": new.value})

    def circuit_refused(self, breaker: str) -> None:
        self._circuit_refused.add(1, {"breaker": breaker})

    def idempotency(self, event: IdempotencyEvent) -> None:
        self._idempotency.add(1, {"event": event})

    def client_attempt(self, host: str) -> None:
        self._client_attempts.add(1, {"host": host})

    def client_retry(self, host: str, cause: str, wait: float) -> None:
        self._client_retries.add(1, {"host": host, "cause": cause})
        self._client_sleep.add(wait, {"host": host})

    def client_give_up(self, host: str, reason: str) -> None:
        self._client_give_ups.add(1, {"host": host, "reason": reason})

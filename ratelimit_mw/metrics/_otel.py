"""The events as OpenTelemetry metrics (``opentelemetry-api``, extra ``otel``).

The instruments carry the Prometheus implementation's names (without ``_total``,
which OTel exporters add) and its attributes, so one dashboard reads either.
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
from ._instruments import (
    UNMATCHED_ROUTE,
    ErrorKind,
    IdempotencyEvent,
    Metrics,
    outcome_of,
    policy_of,
)
from ._prometheus import STORAGE_BUCKETS

__all__ = ["OTelMetrics"]


class OTelMetrics(Metrics):
    """Counts ratelimit_mw's events with a meter of ``meter_provider`` (the global one
    by default); the exporter is the application's own."""

    __slots__ = ("_circuit", "_circuit_refused", "_circuit_transitions", "_client_attempts",
                 "_client_give_ups", "_client_retries", "_client_sleep", "_decisions",
                 "_denials", "_idempotency", "_slot_failures", "_slots", "_storage_errors",
                 "_storage_seconds")

    def __init__(self, meter_provider: Any = None, prefix: str = "ratelimit") -> None:
        meter = otel.get_meter("ratelimit_mw", meter_provider=meter_provider)

        def name(short: str) -> str:
            return f"{prefix}_{short}"

        counter, updown = meter.create_counter, meter.create_up_down_counter
        self._decisions = counter(name("decisions"), description="Requests decided")
        self._denials = counter(name("policy_denials"), description="Denials by policy")
        self._storage_seconds = meter.create_histogram(
            name("storage_call_duration_seconds"), unit="s",
            description="Decisions' storage calls",
            explicit_bucket_boundaries_advisory=list(STORAGE_BUCKETS))
        self._storage_errors = counter(name("storage_errors"), description="Failed calls")
        self._slots = updown(name("slots_in_flight"), description="Concurrency slots held")
        self._slot_failures = counter(name("slot_release_failures"),
                                      description="Slots not given back")
        self._circuit = updown(name("circuit_state"), description="1 for the breaker's state")
        self._circuit_transitions = counter(name("circuit_transitions"),
                                            description="Breaker state changes")
        self._circuit_refused = counter(name("circuit_refused"),
                                        description="Calls a breaker refused")
        self._idempotency = counter(name("idempotency_events"),
                                    description="Replays, conflicts, mismatches, store failures")
        self._client_attempts = counter(name("client_attempts"), description="Attempts sent")
        self._client_retries = counter(name("client_retries"), description="Retries by cause")
        self._client_sleep = counter(name("client_sleep_seconds"), unit="s",
                                     description="Time slept before retries")
        self._client_give_ups = counter(name("client_give_ups"),
                                        description="Requests given up on")

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

    def storage_error(self, kind: ErrorKind) -> None:
        self._storage_errors.add(1, {"kind": kind})

    def slots_in_flight(self, tier: str, change: int) -> None:
        self._slots.add(change, {"tier": tier})

    def slot_release_failed(self, count: int) -> None:
        self._slot_failures.add(count)

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

"""The named events ratelimit_mw reports, as one small interface of no-op methods.

``Metrics`` is the interface and its do-nothing default; ``PrometheusMetrics`` and
``OTelMetrics`` count the events. The parts that report (the middleware, the storage
guard, the slots, breakers, idempotency, the retry transport) hold a ``Metrics`` only
when one is given, so with none they report nothing and pay nothing.
"""

from __future__ import annotations

from typing import Literal, NamedTuple, get_args

from ..breaker import CircuitBreaker, CircuitState
from ..errors import StorageError
from ..events import DecisionEvent
from ..storage.faults import failure_cause

__all__ = ["ERROR_KINDS", "HOLD_BUCKETS", "IDEMPOTENCY_EVENTS", "INSTRUMENTS", "STORAGE_BUCKETS",
           "DecisionOutcome", "ErrorKind", "IdempotencyEvent", "Instrument", "Metrics",
           "error_kind", "outcome_of", "policy_of"]

DecisionOutcome = Literal["allowed", "denied", "shadow_denied", "unavailable"]
IdempotencyEvent = Literal["replay", "conflict", "mismatch", "store_failure"]
IDEMPOTENCY_EVENTS: tuple[IdempotencyEvent, ...] = get_args(IdempotencyEvent)
ErrorKind = Literal["timeout", "oom", "storage", "other", "overloaded"]
ERROR_KINDS: tuple[ErrorKind, ...] = get_args(ErrorKind)

UNMATCHED_ROUTE = "unmatched"
"""The route label of requests that match no route of the app (one label for all)."""

STORAGE_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)
"""Storage latency buckets, in seconds: a Redis round trip is well under a millisecond
to a few."""

HOLD_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
"""Buckets of the time a request waits for its turn, in seconds (up to ``max_delay``)."""


class Instrument(NamedTuple):
    """One instrument, as both backends make it: Prometheus (which adds ``_total`` to a
    counter's name) and OpenTelemetry."""

    name: str
    """Without the namespace (``ratelimit_`` by default)."""
    kind: Literal["counter", "gauge", "histogram"]
    """A gauge goes up and down: an OTel up-down counter, a Prometheus gauge summed over
    live workers."""
    help: str
    labels: tuple[str, ...] = ()
    unit: str = ""
    buckets: tuple[float, ...] = ()


INSTRUMENTS: dict[str, Instrument] = {instrument.name: instrument for instrument in (
    Instrument("decisions", "counter", "Requests decided, by outcome and source",
               ("tier", "route", "outcome", "source")),
    Instrument("policy_denials", "counter", "Denials by the limit that denied",
               ("tier", "route", "policy", "outcome")),
    Instrument("storage_call_duration_seconds", "histogram",
               "Decisions' awaited storage calls", unit="s", buckets=STORAGE_BUCKETS),
    Instrument("storage_calls_in_place", "counter",
               "Decisions a storage in this process made without awaiting (not timed)"),
    Instrument("storage_errors", "counter", "Failed storage calls, by kind", ("kind",)),
    Instrument("slots_in_flight", "gauge", "Concurrency slots held", ("tier",)),
    Instrument("slot_release_failures", "counter", "Slots that could not be given back"),
    Instrument("settlement_failures", "counter",
               "Charges not settled after the response (their estimates stay charged)"),
    Instrument("held_requests", "gauge", "Requests held for their turn now (leaky bucket)",
               ("tier",)),
    Instrument("hold_seconds", "histogram",
               "How long admitted requests were held for their turn", ("tier",), unit="s",
               buckets=HOLD_BUCKETS),
    Instrument("holds_given_up", "counter",
               "Requests that got no turn after all, by why: the worker held too many "
               "(full), or the client left while held (left)", ("reason",)),
    Instrument("websocket_messages_refused", "counter",
               "Websocket messages over a limit, by the limit and what was done",
               ("limit", "action")),
    Instrument("circuit_state", "gauge", "1 for the breaker's state (summed over workers)",
               ("breaker", "state")),
    Instrument("circuit_transitions", "counter", "Breaker state changes",
               ("breaker", "from_state", "to_state")),
    Instrument("circuit_refused", "counter", "Calls a breaker refused", ("breaker",)),
    Instrument("idempotency_events", "counter",
               "Replays, conflicts (409), mismatches (422), store failures", ("event",)),
    Instrument("client_attempts", "counter", "Attempts sent", ("host",)),
    Instrument("client_retries", "counter", "Retries by cause", ("host", "cause")),
    Instrument("client_sleep_seconds", "counter", "Time slept before retries", ("host",),
               unit="s"),
    Instrument("client_give_ups", "counter", "Requests given up on", ("host", "reason")),
)}
"""Every instrument ratelimit_mw reports: its name, kind, help text, labels and buckets,
the one description both backends read."""


def error_kind(error: BaseException) -> ErrorKind:
    """A failed storage call's kind: it timed out, Redis was full (``OOM``: it refuses
    writes under ``noeviction``), the storage reported another error (its connection,
    mostly), or anything else (a bug of a custom storage)."""
    cause = failure_cause(error)  # through the chain: a storage's error wraps its cause
    if cause in ("timeout", "oom"):
        return "timeout" if cause == "timeout" else "oom"
    if isinstance(error, StorageError):
        return "storage"
    return "other"


def outcome_of(event: DecisionEvent) -> DecisionOutcome:
    """What happened to the request: let through, refused, let through by shadow mode,
    or decided by nobody (the storage was down)."""
    if event.verdict is None:
        return "unavailable"
    if event.refused:
        return "denied"
    return "shadow_denied" if event.shadow else "allowed"


def policy_of(event: DecisionEvent) -> str:
    """The name of the limit that denied the request ('' when none did)."""
    verdict = event.verdict
    binding = verdict.binding if verdict is not None else None
    if binding is not None:
        return binding.limit.name
    if verdict is not None:  # a shadow denial: the first limit that said no
        for decision in verdict.decisions:
            if not decision.allowed:
                return decision.limit.name
    return ""


class Metrics:
    """What ratelimit_mw reports. Every method does nothing here; an implementation
    overrides those it counts. Labels are bounded: tier and policy names, route
    templates, breaker names, hosts; never a key, an IP or a raw path."""

    __slots__ = ()

    def decision(self, event: DecisionEvent) -> None:
        """A request was decided (the middleware's ``on_decision`` event)."""

    def storage_call(self, seconds: float) -> None:
        """A decision's awaited storage call took ``seconds`` (failed calls included)."""

    def storage_call_in_place(self) -> None:
        """A storage in this process decided without awaiting (memory storage): counted,
        not timed, since timing it would cost more than the call."""

    def storage_error(self, kind: ErrorKind) -> None:
        """A storage call failed (``error_kind`` of its exception), or was not made
        because too many decisions already waited on the storage (``overloaded``)."""

    def slots_in_flight(self, tier: str, change: int) -> None:
        """Concurrency slots held by requests of ``tier`` changed by ``change``."""

    def slot_release_failed(self, count: int) -> None:
        """``count`` slots could not be given back (their lease ends them)."""

    def settlement_failed(self, count: int) -> None:
        """``count`` charges could not be settled after the response (the storage
        failed): their estimates stay charged."""

    def held(self, tier: str, change: int) -> None:
        """Requests of ``tier`` held for their turn changed by ``change``."""

    def waited(self, tier: str, seconds: float) -> None:
        """A request of ``tier`` was held ``seconds`` for its turn, then admitted."""

    def hold_given_up(self, reason: str) -> None:
        """A request that would have waited got no turn: ``full`` (the worker held its
        most) or ``left`` (its client left while held)."""

    def websocket_message_refused(self, limit: str, action: str) -> None:
        """A websocket message was over its ``connection`` or ``caller`` limit, and the
        socket was ``closed`` or the message ``dropped``."""

    def circuit_state(self, breaker: str, old: CircuitState | None,
                      new: CircuitState) -> None:
        """``breaker`` is in state ``new`` (``old`` None: first seen)."""

    def circuit_refused(self, breaker: str) -> None:
        """``breaker`` refused a call without making it."""

    def idempotency(self, event: IdempotencyEvent) -> None:
        """The idempotency middleware replayed, answered 409 or 422, or its store failed."""

    def client_attempt(self, host: str) -> None:
        """The retry transport sent an attempt to ``host``."""

    def client_retry(self, host: str, cause: str, wait: float) -> None:
        """It will retry after ``cause`` (a status code or an error class), in ``wait`` s."""

    def client_give_up(self, host: str, reason: str) -> None:
        """It stopped retrying for ``reason`` (``max_retries``, ``max_time`` …)."""

    def watch(self, breaker: CircuitBreaker) -> None:
        """Report ``breaker``'s state, transitions and refusals from now on."""
        breaker.add_watcher(self)
        self.circuit_state(breaker.name, None, breaker.state)

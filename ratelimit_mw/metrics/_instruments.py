"""The named events ratelimit_mw reports, as one small interface of no-op methods.

``Metrics`` is the interface and its do-nothing default; ``PrometheusMetrics`` and
``OTelMetrics`` count the events. The parts that report (the middleware, the storage
guard, the slots, breakers, idempotency, the retry transport) hold a ``Metrics`` only
when one is given, so with none they report nothing and pay nothing.
"""

from __future__ import annotations

from typing import Literal, get_args

from ..breaker import CircuitBreaker, CircuitState
from ..errors import StorageError
from ..events import DecisionEvent

__all__ = ["ERROR_KINDS", "IDEMPOTENCY_EVENTS", "DecisionOutcome", "ErrorKind",
           "IdempotencyEvent", "Metrics", "error_kind", "outcome_of", "policy_of"]

DecisionOutcome = Literal["allowed", "denied", "shadow_denied", "unavailable"]
IdempotencyEvent = Literal["replay", "conflict", "mismatch", "store_failure"]
IDEMPOTENCY_EVENTS: tuple[IdempotencyEvent, ...] = get_args(IdempotencyEvent)
ErrorKind = Literal["timeout", "storage", "other"]
ERROR_KINDS: tuple[ErrorKind, ...] = get_args(ErrorKind)

UNMATCHED_ROUTE = "unmatched"
"""The route label of requests that match no route of the app (one label for all)."""


def error_kind(error: BaseException) -> ErrorKind:
    """A failed storage call's kind: it timed out, the storage reported an error (its
    connection, mostly), or anything else (a bug of a custom storage)."""
    if isinstance(error, TimeoutError):
        return "timeout"
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
        """A decision's storage call took ``seconds`` (failed calls included)."""

    def storage_error(self, kind: ErrorKind) -> None:
        """A storage call failed (``error_kind`` of its exception)."""

    def slots_in_flight(self, tier: str, change: int) -> None:
        """Concurrency slots held by requests of ``tier`` changed by ``change``."""

    def slot_release_failed(self, count: int) -> None:
        """``count`` slots could not be given back (their lease ends them)."""

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

"""The transport's circuit breaker calls: refuse while open, ask leave, report outcomes."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..breaker import CircuitBreaker, CircuitOpenError, CircuitState, Permit
from .libraries import TransportError
from .policy import RETRY_ERRORS

if TYPE_CHECKING:
    import httpx

__all__ = ["CircuitOpenTransportError", "acquire_permit", "record_outcome", "refuse_if_open"]


class CircuitOpenTransportError(TransportError, CircuitOpenError):
    """The transport's circuit breaker refused the attempt: no request was sent.

    Both an ``httpx.TransportError`` (so ``except httpx.HTTPError`` sees it; the same
    for httpx2) and the breaker's `CircuitOpenError`; ``remaining`` is the cooldown
    left, in seconds (0.0 when the breaker is half-open with every trial slot taken).
    """

    def __init__(
        self,
        remaining: float,
        name: str = "circuit",
        state: CircuitState = CircuitState.OPEN,
        *,
        request: httpx.Request | None = None,
    ) -> None:
        # httpx's __init__ chain would hand the message to CircuitOpenError as
        # ``remaining``: build the breaker error, then set what httpx expects.
        CircuitOpenError.__init__(self, remaining, name, state)
        self._request = request


def refuse_if_open(
    breaker: CircuitBreaker | None,
    request: httpx.Request,
    *,
    longer_than: float = 0.0,
    cause: BaseException | None = None,
) -> None:
    """Raise `CircuitOpenTransportError` while the breaker's cooldown outlasts
    ``longer_than`` seconds: fail fast rather than queue in the limiter, or wait for a
    retry the breaker would refuse anyway."""
    if breaker is not None and breaker.remaining_cooldown > longer_than:
        raise _refusal(breaker, request) from cause


def acquire_permit(breaker: CircuitBreaker | None, request: httpx.Request) -> Permit | None:
    """Ask the breaker, if any, for leave to send one attempt; raise if it refuses."""
    if breaker is None:
        return None
    permit = breaker.try_acquire()
    if permit is None:
        raise _refusal(breaker, request)
    return permit


def record_outcome(permit: Permit | None, outcome: httpx.Response | BaseException) -> None:
    """Tell the breaker how an attempt went: 5xx and connection errors are failures."""
    if permit is None:
        return
    if not isinstance(outcome, BaseException):  # a response
        if outcome.status_code >= 500:
            permit.record_failure()
        else:
            permit.record_success()
    elif isinstance(outcome, RETRY_ERRORS):
        permit.record_failure()
    else:
        permit.record_exception(outcome)  # the breaker's rules; a cancellation frees the slot


def _refusal(breaker: CircuitBreaker, request: httpx.Request) -> CircuitOpenTransportError:
    state = breaker.state
    return CircuitOpenTransportError(
        breaker.remaining_cooldown, breaker.name, state, request=request
    )

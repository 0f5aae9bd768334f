"""The states of a circuit breaker and the error it raises when it refuses a call."""

from __future__ import annotations

import enum
from typing import Protocol

__all__ = ["BreakerWatcher", "CircuitOpenError", "CircuitState", "refusal_in"]


class CircuitState(enum.StrEnum):
    """Where a breaker stands; the value is what logs and ``repr`` print."""

    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


class BreakerWatcher(Protocol):
    """What a breaker tells its watchers (``add_watcher``): metrics, typically."""

    def circuit_state(self, breaker: str, old: CircuitState | None,
                      new: CircuitState) -> None: ...
    def circuit_refused(self, breaker: str) -> None: ...


class CircuitOpenError(Exception):
    """The breaker refused a call without making it; ``remaining`` is the cooldown left."""

    def __init__(
        self, remaining: float, name: str = "circuit", state: CircuitState = CircuitState.OPEN
    ) -> None:
        self.remaining = remaining
        self.name = name
        self.state = state
        if state is CircuitState.OPEN:
            msg = f"circuit {name!r} is open; calls are refused for another {remaining:.1f}s"
        else:
            msg = f"circuit {name!r} is half-open and every trial call slot is taken; retry soon"
        super().__init__(msg)

    def __reduce__(self) -> tuple[type[CircuitOpenError], tuple[float, str, CircuitState]]:
        return type(self), (self.remaining, self.name, self.state)


def refusal_in(exc: BaseException) -> CircuitOpenError | None:
    """The breaker's refusal that ``exc`` is: a `CircuitOpenError`, or an exception
    group (a task group fanning out) holding refusals and nothing else; else None."""
    if isinstance(exc, CircuitOpenError):
        return exc
    if isinstance(exc, BaseExceptionGroup):
        refusals, rest = exc.split(CircuitOpenError)
        if refusals is not None and rest is None:
            first: BaseException = refusals
            while isinstance(first, BaseExceptionGroup):
                first = first.exceptions[0]
            return first if isinstance(first, CircuitOpenError) else None
    return None

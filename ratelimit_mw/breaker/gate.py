"""What code that only asks a breaker for permits needs of it (``CircuitBreaker`` fits)."""

from __future__ import annotations

from typing import Protocol

__all__ = ["Gate", "GatePermit"]


class GatePermit(Protocol):
    """One admitted call: say how it went, or give the permit back unused."""

    def record_success(self) -> None: ...
    def record_failure(self) -> None: ...
    def release(self) -> None: ...


class Gate(Protocol):
    """A breaker as its callers see it: a permit per call, or None while it refuses."""

    def try_acquire(self) -> GatePermit | None: ...

    @property
    def remaining_cooldown(self) -> float: ...

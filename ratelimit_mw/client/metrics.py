"""What the retry transport reports to metrics (``ratelimit_mw.metrics`` implements it)."""

from __future__ import annotations

from typing import Protocol

from ..breaker import BreakerWatcher, CircuitBreaker

__all__ = ["ClientMetrics"]


class ClientMetrics(BreakerWatcher, Protocol):
    """Attempts, retries and give-ups per host, and the states of a breaker watched."""

    def client_attempt(self, host: str) -> None: ...
    def client_retry(self, host: str, cause: str, wait: float) -> None: ...
    def client_give_up(self, host: str, reason: str) -> None: ...
    def watch(self, breaker: CircuitBreaker) -> None: ...

"""ratelimit_mw: rate limits, quotas and polite retries for Starlette and FastAPI.

Names load lazily, so that ``ratelimit_mw.client`` works with only httpx installed.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .breaker import CircuitBreaker, CircuitOpenError, CircuitState
    from .breaker.guard import BreakerGuard, breaker_dependency, circuit_open_handler
    from .client_ip import ClientIP, TrustedProxies
    from .decision import NEVER, Decision, Lease, Verdict
    from .errors import ConfigError, RateLimitError, StorageError
    from .events import DecisionEvent
    from .failure import FailureStats
    from .idempotency import (
        IdempotencyMiddleware,
        IdempotencyStore,
        MemoryIdempotencyStore,
        RedisIdempotencyStore,
        StoredResponse,
    )
    from .identity import APIKey, AuthenticatedUser, Caller
    from .middleware import RateLimitMiddleware
    from .policy import ALGORITHM_NAMES, AlgorithmName, Hit, Limit
    from .quota import quota_router
    from .rates import Rate, parse_rate
    from .responses import Denial
    from .routes import RouteLimit, RouteRule, cost, exempt, limit
    from .settings import RateLimitSettings
    from .storage import MemoryStorage, RedisStorage, Storage, storage_from_url
    from .storage.base import UsageRetention
    from .tiers import Tier, TierByAPIKey, TierFromHeader, TierTable

_EXPORTS = {
    "ALGORITHM_NAMES": "policy",
    "APIKey": "identity",
    "AlgorithmName": "policy",
    "AuthenticatedUser": "identity",
    "BreakerGuard": "breaker.guard",
    "Caller": "identity",
    "CircuitBreaker": "breaker",
    "CircuitOpenError": "breaker",
    "CircuitState": "breaker",
    "ClientIP": "client_ip",
    "ConfigError": "errors",
    "Decision": "decision",
    "DecisionEvent": "events",
    "Denial": "responses",
    "FailureStats": "failure",
    "Hit": "policy",
    "IdempotencyMiddleware": "idempotency",
    "IdempotencyStore": "idempotency",
    "Lease": "decision",
    "Limit": "policy",
    "MemoryIdempotencyStore": "idempotency",
    "MemoryStorage": "storage",
    "NEVER": "decision",
    "Rate": "rates",
    "RateLimitError": "errors",
    "RateLimitMiddleware": "middleware",
    "RateLimitSettings": "settings",
    "RedisIdempotencyStore": "idempotency",
    "RedisStorage": "storage",
    "RouteLimit": "routes",
    "RouteRule": "routes",
    "Storage": "storage",
    "StorageError": "errors",
    "StoredResponse": "idempotency",
    "Tier": "tiers",
    "TierByAPIKey": "tiers",
    "TierFromHeader": "tiers",
    "TierTable": "tiers",
    "TrustedProxies": "client_ip",
    "UsageRetention": "storage.base",
    "Verdict": "decision",
    "breaker_dependency": "breaker.guard",
    "circuit_open_handler": "breaker.guard",
    "cost": "routes",
    "exempt": "routes",
    "limit": "routes",
    "parse_rate": "rates",
    "quota_router": "quota",
    "storage_from_url": "storage",
}

__all__ = [
    "ALGORITHM_NAMES",
    "NEVER",
    "APIKey",
    "AlgorithmName",
    "AuthenticatedUser",
    "BreakerGuard",
    "Caller",
    "CircuitBreaker",
    "CircuitOpenError",
    "CircuitState",
    "ClientIP",
    "ConfigError",
    "Decision",
    "DecisionEvent",
    "Denial",
    "FailureStats",
    "Hit",
    "IdempotencyMiddleware",
    "IdempotencyStore",
    "Lease",
    "Limit",
    "MemoryIdempotencyStore",
    "MemoryStorage",
    "Rate",
    "RateLimitError",
    "RateLimitMiddleware",
    "RateLimitSettings",
    "RedisIdempotencyStore",
    "RedisStorage",
    "RouteLimit",
    "RouteRule",
    "Storage",
    "StorageError",
    "StoredResponse",
    "Tier",
    "TierByAPIKey",
    "TierFromHeader",
    "TierTable",
    "TrustedProxies",
    "UsageRetention",
    "Verdict",
    "breaker_dependency",
    "circuit_open_handler",
    "cost",
    "exempt",
    "limit",
    "parse_rate",
    "quota_router",
    "storage_from_url",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        msg = f"module 'ratelimit_mw' has no attribute {name!r}"
        raise AttributeError(msg)
    value = getattr(import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return [*globals(), *__all__]

"""ratelimit_mw: rate limits, quotas and polite retries for Starlette and FastAPI.

Names load lazily, so that ``ratelimit_mw.client`` works with only httpx installed.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .breaker import CircuitBreaker, CircuitOpenError, CircuitState
    from .decision import NEVER, Decision, Lease, Verdict
    from .errors import ConfigError, RateLimitError, StorageError
    from .guard import BreakerGuard, breaker_dependency
    from .idempotency import (
        IdempotencyMiddleware,
        IdempotencyStore,
        MemoryIdempotencyStore,
        RedisIdempotencyStore,
        StoredResponse,
    )
    from .limit import ALGORITHM_NAMES, AlgorithmName, Hit, Limit, limits_from
    from .rates import Rate, parse_rate, parse_rates
    from .storage import MemoryStorage, RedisStorage, Storage, storage_from_url
    from .storage.base import UsageRetention

_EXPORTS = {
    "ALGORITHM_NAMES": "limit",
    "AlgorithmName": "limit",
    "BreakerGuard": "guard",
    "CircuitBreaker": "breaker",
    "CircuitOpenError": "breaker",
    "CircuitState": "breaker",
    "ConfigError": "errors",
    "Decision": "decision",
    "Hit": "limit",
    "IdempotencyMiddleware": "idempotency",
    "IdempotencyStore": "idempotency",
    "Lease": "decision",
    "Limit": "limit",
    "MemoryIdempotencyStore": "idempotency",
    "MemoryStorage": "storage",
    "NEVER": "decision",
    "Rate": "rates",
    "RateLimitError": "errors",
    "RedisIdempotencyStore": "idempotency",
    "RedisStorage": "storage",
    "Storage": "storage",
    "StorageError": "errors",
    "StoredResponse": "idempotency",
    "UsageRetention": "storage.base",
    "Verdict": "decision",
    "breaker_dependency": "guard",
    "limits_from": "limit",
    "parse_rate": "rates",
    "parse_rates": "rates",
    "storage_from_url": "storage",
}

__all__ = [
    "ALGORITHM_NAMES",
    "NEVER",
    "AlgorithmName",
    "BreakerGuard",
    "CircuitBreaker",
    "CircuitOpenError",
    "CircuitState",
    "ConfigError",
    "Decision",
    "Hit",
    "IdempotencyMiddleware",
    "IdempotencyStore",
    "Lease",
    "Limit",
    "MemoryIdempotencyStore",
    "MemoryStorage",
    "Rate",
    "RateLimitError",
    "RedisIdempotencyStore",
    "RedisStorage",
    "Storage",
    "StorageError",
    "StoredResponse",
    "UsageRetention",
    "Verdict",
    "breaker_dependency",
    "limits_from",
    "parse_rate",
    "parse_rates",
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

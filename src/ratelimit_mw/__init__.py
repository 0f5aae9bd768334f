"""ratelimit_mw: rate limits, quotas and polite retries for Starlette and FastAPI.

Names load lazily, so that ``ratelimit_mw.client`` works with only httpx installed.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .decision import NEVER, Decision, Verdict
    from .errors import ConfigError, RateLimitError, StorageError
    from .limit import ALGORITHM_NAMES, AlgorithmName, Hit, Limit, limits_from
    from .rates import Rate, parse_rate, parse_rates
    from .storage import MemoryStorage, RedisStorage, Storage, storage_from_url

_EXPORTS = {
    "ALGORITHM_NAMES": "limit",
    "NEVER": "decision",
    "AlgorithmName": "limit",
    "ConfigError": "errors",
    "Decision": "decision",
    "Hit": "limit",
    "Limit": "limit",
    "MemoryStorage": "storage",
    "Rate": "rates",
    "RateLimitError": "errors",
    "RedisStorage": "storage",
    "Storage": "storage",
    "StorageError": "errors",
    "Verdict": "decision",
    "limits_from": "limit",
    "parse_rate": "rates",
    "parse_rates": "rates",
    "storage_from_url": "storage",
}

__all__ = [
    "ALGORITHM_NAMES",
    "NEVER",
    "AlgorithmName",
    "ConfigError",
    "Decision",
    "Hit",
    "Limit",
    "MemoryStorage",
    "Rate",
    "RateLimitError",
    "RedisStorage",
    "Storage",
    "StorageError",
    "Verdict",
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

"""ratelimit_mw: rate limits, quotas and polite retries for Starlette and FastAPI."""

from __future__ import annotations

from .decision import NEVER, Decision, Verdict
from .errors import ConfigError, RateLimitError, StorageError
from .limit import ALGORITHM_NAMES, AlgorithmName, Hit, Limit, limits_from
from .rates import Rate, parse_rate, parse_rates
from .storage import MemoryStorage, RedisStorage, Storage, storage_from_url

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

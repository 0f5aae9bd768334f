"""ratelimit_mw: rate limits, quotas and polite retries for Starlette and FastAPI.

The names a middleware user needs live here; the rest in their own modules
(``ratelimit_mw.client``, ``ratelimit_mw.breaker``, ``ratelimit_mw.idempotency``,
``ratelimit_mw.policy``, ``ratelimit_mw.storage``, ...).
"""

from .errors import ConfigError, StorageError
from .events import DecisionEvent
from .idempotency import IdempotencyMiddleware
from .identity import APIKey, AuthenticatedUser
from .middleware import RateLimitMiddleware
from .policy import Hit, Limit
from .quota import quota_router
from .responses import Denial
from .routes import RouteRule, cost, exempt, limit
from .settings import RateLimitSettings
from .storage import MemoryStorage, RedisStorage, Storage, storage_from_url
from .tiers import Tier, TierByAPIKey, TierFromHeader

__all__ = [
    "APIKey",
    "AuthenticatedUser",
    "ConfigError",
    "DecisionEvent",
    "Denial",
    "Hit",
    "IdempotencyMiddleware",
    "Limit",
    "MemoryStorage",
    "RateLimitMiddleware",
    "RateLimitSettings",
    "RedisStorage",
    "RouteRule",
    "Storage",
    "StorageError",
    "Tier",
    "TierByAPIKey",
    "TierFromHeader",
    "cost",
    "exempt",
    "limit",
    "quota_router",
    "storage_from_url",
]

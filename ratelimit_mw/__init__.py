"""ratelimit_mw: rate limits, quotas and polite retries for Starlette and FastAPI.

The names a middleware user needs live here; the rest in their own modules
(``ratelimit_mw.client``, ``ratelimit_mw.breaker``, ``ratelimit_mw.idempotency``,
``ratelimit_mw.limits``, ``ratelimit_mw.storage``, ...).

Each name is imported on first use, so that ``import ratelimit_mw.client`` loads the
retrying client without the server side (Starlette, redis-py, pydantic). Type checkers
read the imports under ``typing.TYPE_CHECKING``, which a test keeps equal to ``_HOMES``.
"""

import typing

from .lazy import lazy_names as _lazy_names

__version__ = "0.1.0"

if typing.TYPE_CHECKING:
    from .charges import cost_from, cost_from_header, cost_from_state
    from .errors import ConfigError, StorageError
    from .events import DecisionEvent
    from .hits import Hit
    from .idempotency import IdempotencyMiddleware
    from .identity import APIKey, AuthenticatedUser
    from .limits import Limit
    from .middleware import RateLimitMiddleware
    from .partitions import json_field
    from .quota import quota_router
    from .responses import Denial
    from .routes import RouteRule, cost, exempt, limit, spends
    from .settings import RateLimitSettings
    from .storage import MemoryStorage, RedisStorage, Storage, storage_from_url
    from .tiers import Tier, TierByAPIKey, TierFromHeader

    compiled: bool

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
    "compiled",
    "cost",
    "cost_from",
    "cost_from_header",
    "cost_from_state",
    "exempt",
    "json_field",
    "limit",
    "quota_router",
    "spends",
    "storage_from_url",
]

_HOMES = {
    "APIKey": ".identity",
    "AuthenticatedUser": ".identity",
    "ConfigError": ".errors",
    "DecisionEvent": ".events",
    "Denial": ".responses",
    "Hit": ".hits",
    "IdempotencyMiddleware": ".idempotency",
    "Limit": ".limits",
    "MemoryStorage": ".storage",
    "RateLimitMiddleware": ".middleware",
    "RateLimitSettings": ".settings",
    "RedisStorage": ".storage",
    "RouteRule": ".routes",
    "Storage": ".storage",
    "StorageError": ".errors",
    "Tier": ".tiers",
    "TierByAPIKey": ".tiers",
    "TierFromHeader": ".tiers",
    "cost": ".routes",
    "cost_from": ".charges",
    "cost_from_header": ".charges",
    "cost_from_state": ".charges",
    "exempt": ".routes",
    "json_field": ".partitions",
    "limit": ".routes",
    "quota_router": ".quota",
    "spends": ".routes",
    "storage_from_url": ".storage",
}
"""Where each public name is defined: the module imported when the name is first read."""


def _is_compiled() -> bool:
    """Whether this install's per-request modules are mypyc's extension modules."""
    from importlib.machinery import EXTENSION_SUFFIXES
    from importlib.util import find_spec

    spec = find_spec(".middleware", __name__)
    return spec is not None and (spec.origin or "").endswith(tuple(EXTENSION_SUFFIXES))


_getattr, __dir__ = _lazy_names(__name__, _HOMES)


def __getattr__(name: str) -> typing.Any:
    if name == "compiled":
        globals()[name] = compiled = _is_compiled()
        return compiled
    return _getattr(name)

"""Per-caller limits at run time: tiers, custom limits and blocks, without a restart.

    overrides = Overrides.from_url(settings.storage_url)
    app.add_middleware(RateLimitMiddleware, settings=settings, overrides=overrides)
    app.include_router(admin_router())   # Starlette: routes=[*admin_router().routes]

Every worker keeps a local view of the overrides (see ``view``), so an ordinary request
costs no storage call more; changes made through any worker apply on all of them
within a second.
"""

from .admin import ADMIN_PATH, AdminEndpoints, admin_router
from .model import Override, OverrideError, caller_key
from .store import MemoryOverrideStore, OverrideStore, RedisOverrideStore
from .view import Overrides

__all__ = [
    "ADMIN_PATH",
    "AdminEndpoints",
    "MemoryOverrideStore",
    "Override",
    "OverrideError",
    "OverrideStore",
    "Overrides",
    "RedisOverrideStore",
    "admin_router",
    "caller_key",
]

"""Idempotency keys: a retried POST or PATCH gets the first response again, not a second run.

``IdempotencyMiddleware`` follows draft-ietf-httpapi-idempotency-key-header and
Stripe: keys scoped to the caller, request fingerprints, 409 while in flight,
422 on reuse for another request, responses kept 24 h, in memory or in Redis.

>>> from starlette.applications import Starlette
>>> from starlette.middleware import Middleware
>>> from ratelimit_mw.idempotency import IdempotencyMiddleware, MemoryIdempotencyStore
>>> app = Starlette(middleware=[
...     Middleware(IdempotencyMiddleware, store=MemoryIdempotencyStore(), required=["/payments"]),
... ])

With several workers use ``RedisIdempotencyStore.from_url("redis://...")``.
"""

from __future__ import annotations

from .fingerprint import fingerprint, record_key
from .header import MAX_KEY_LENGTH, InvalidKeyError, parse_idempotency_key
from .memory import MemoryIdempotencyStore
from .middleware import IdempotencyMiddleware, IdentityFunc
from .redis import RedisIdempotencyStore
from .store import Claim, ClaimOutcome, IdempotencyStore, StoredResponse

__all__ = [
    "MAX_KEY_LENGTH",
    "Claim",
    "ClaimOutcome",
    "IdempotencyMiddleware",
    "IdempotencyStore",
    "IdentityFunc",
    "InvalidKeyError",
    "MemoryIdempotencyStore",
    "RedisIdempotencyStore",
    "StoredResponse",
    "fingerprint",
    "parse_idempotency_key",
    "record_key",
]

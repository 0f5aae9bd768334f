"""OpenAPI for FastAPI apps: the rate limits, the library's answers (429, 503, the
Idempotency-Key protocol) and their headers, in the app's own document.

>>> from fastapi import FastAPI
>>> from ratelimit_mw import RateLimitMiddleware, RateLimitSettings
>>> from ratelimit_mw.openapi import document_limits
>>> app = FastAPI()
>>> app.add_middleware(RateLimitMiddleware,
...                    settings=RateLimitSettings(default_limits="100/minute"))
>>> document_limits(app)
"""

from .document import document_limits

__all__ = ["document_limits"]

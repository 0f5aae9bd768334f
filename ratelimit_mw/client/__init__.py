"""Polite clients for rate-limited HTTP APIs: a retrying httpx2 or httpx transport and a
token bucket.

Install with ``pip install 'ratelimit_mw[client]'`` (the base install plus httpx), or
add httpx2 instead: it works with either, or both side by side. Nothing here imports
the server side of ratelimit_mw but its dependency-free circuit breaker (for
``RetryTransport(breaker=...)``); the parent package's top level does.

>>> from ratelimit_mw.client import RetryPolicy, RetryTransport, TokenBucket
>>> transport = RetryTransport(
...     policy=RetryPolicy(max_retries=5, max_time=30.0, add_idempotency_key=True),
...     limiter=TokenBucket(rate=10, capacity=20),  # at most 10 requests a second, bursts of 20
... )

Then ``httpx2.AsyncClient(transport=transport)`` or ``httpx.Client(transport=transport)``;
``set_testing(True)`` in a test suite makes every wait instant.
"""

from __future__ import annotations

from .backoff import full_jitter
from .bucket import TokenBucket
from .budget import RetryBudget
from .circuit import CircuitOpenTransportError
from .errors import GiveUpReason, LimiterTimeout, RetriesExhausted
from .functions import arequest, request
from .hints import (
    DEFAULT_HINTS,
    HintParser,
    Quota,
    duration_hint,
    github_reset_hint,
    ratelimit_header_hint,
    read_quota,
    retry_after_hint,
)
from .policy import RETRY_ERRORS, RETRY_METHODS, RETRY_STATUSES, RetryPolicy
from .retry_after import parse_retry_after
from .testing import is_testing, set_testing
from .transport import RetryTransport

__all__ = [
    "DEFAULT_HINTS",
    "RETRY_ERRORS",
    "RETRY_METHODS",
    "RETRY_STATUSES",
    "CircuitOpenTransportError",
    "GiveUpReason",
    "HintParser",
    "LimiterTimeout",
    "Quota",
    "RetriesExhausted",
    "RetryBudget",
    "RetryPolicy",
    "RetryTransport",
    "TokenBucket",
    "arequest",
    "duration_hint",
    "full_jitter",
    "github_reset_hint",
    "is_testing",
    "parse_retry_after",
    "ratelimit_header_hint",
    "read_quota",
    "request",
    "retry_after_hint",
    "set_testing",
]

"""Metrics for ratelimit_mw: Prometheus (extra ``prometheus``) or OpenTelemetry (extra
``otel``), fed by the middleware, the storage guard, breakers, idempotency and the
retry transport.

>>> from ratelimit_mw.metrics import PrometheusMetrics
>>> metrics = PrometheusMetrics()  # then RateLimitMiddleware(app, metrics=metrics)

The implementations load on first use, so importing this package needs neither extra.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..lazy import lazy_names as _lazy_names
from .instruments import (
    ERROR_KINDS,
    IDEMPOTENCY_EVENTS,
    INSTRUMENTS,
    STORAGE_BUCKETS,
    DecisionOutcome,
    ErrorKind,
    IdempotencyEvent,
    Instrument,
    Metrics,
    error_kind,
)

if TYPE_CHECKING:
    from .otel import OTelMetrics
    from .prometheus import PrometheusMetrics

__all__ = ["ERROR_KINDS", "IDEMPOTENCY_EVENTS", "INSTRUMENTS", "STORAGE_BUCKETS",
           "DecisionOutcome", "ErrorKind", "IdempotencyEvent", "Instrument", "Metrics",
           "OTelMetrics", "PrometheusMetrics", "error_kind"]

_HOMES = {"OTelMetrics": ".otel", "PrometheusMetrics": ".prometheus"}
"""The names that load their extra's library on first use, and their modules."""
__getattr__, __dir__ = _lazy_names(__name__, _HOMES)

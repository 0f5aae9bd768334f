"""Metrics for ratelimit_mw: Prometheus (extra ``prometheus``) or OpenTelemetry (extra
``otel``), fed by the middleware, the storage guard, breakers, idempotency and the
retry transport.

>>> from ratelimit_mw.metrics import PrometheusMetrics
>>> metrics = PrometheusMetrics()  # then RateLimitMiddleware(app, metrics=metrics)

The implementations load on first use, so importing this package needs neither extra.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ._instruments import (
    ERROR_KINDS,
    IDEMPOTENCY_EVENTS,
    DecisionOutcome,
    ErrorKind,
    IdempotencyEvent,
    Metrics,
    error_kind,
)

if TYPE_CHECKING:
    from ._otel import OTelMetrics
    from ._prometheus import PrometheusMetrics

__all__ = ["ERROR_KINDS", "IDEMPOTENCY_EVENTS", "DecisionOutcome", "ErrorKind",
           "IdempotencyEvent", "Metrics", "OTelMetrics", "PrometheusMetrics", "error_kind"]


def __getattr__(name: str) -> Any:
    if name == "PrometheusMetrics":
        from ._prometheus import PrometheusMetrics

        return PrometheusMetrics
    if name == "OTelMetrics":
        from ._otel import OTelMetrics

        return OTelMetrics
    msg = f"module {__name__!r} has no attribute {name!r}"
    raise AttributeError(msg)

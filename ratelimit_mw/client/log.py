"""The client's logger, and the lines the transport logs when it retries or gives up."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import httpx

__all__ = ["log_give_up", "log_retry", "loggable_url", "logger"]

logger = logging.getLogger("ratelimit_mw.client")


def loggable_url(url: httpx.URL) -> str:
    """The URL without query string, fragment or credentials, safe for logs."""
    return str(url.copy_with(query=None, fragment=None, userinfo=b""))


def log_retry(request: httpx.Request, outcome: str, retry: int, wait: float) -> None:
    """Log at INFO that retry number ``retry`` follows ``outcome`` after ``wait`` seconds."""
    url = loggable_url(request.url)
    logger.info(
        "retrying %s %s after %s: attempt %d in %.3fs",
        request.method,
        url,
        outcome,
        retry,
        wait,
        extra={
            "attempt": retry,
            "wait": wait,
            "outcome": outcome,
            "method": request.method,
            "url": url,
        },
    )


def log_give_up(request: httpx.Request, outcome: str, reason: str, wait: float | None) -> None:
    """Log at WARNING that no retry follows ``outcome`` (``wait`` None: the limiter had no
    token in time; else the wait that would not fit)."""
    logger.warning(
        "giving up on %s %s after %s: %s (%s)",
        request.method,
        loggable_url(request.url),
        outcome,
        reason,
        "the limiter had no token in time" if wait is None
        else f"next wait would be {wait:.3f}s",
    )

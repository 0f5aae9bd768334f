"""The errors the retrying transport raises when it stops without a response to return."""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from .libraries import HTTPError, TimeoutException

if TYPE_CHECKING:
    import httpx

__all__ = ["GiveUpReason", "LimiterTimeout", "RetriesExhausted"]

GiveUpReason = Literal["max_retries", "max_time", "retry_budget", "not_replayable"]


class RetriesExhausted(HTTPError):
    """A retryable response was the last one: retries ran out, or the next wait would not fit.

    Raised only with ``RetryPolicy(raise_on_give_up=True)``; otherwise that last
    response is returned. ``response`` is closed but its status and headers
    are there; ``reason`` says why no retry followed.
    """

    def __init__(
        self,
        message: str,
        *,
        request: httpx.Request,
        response: httpx.Response,
        reason: GiveUpReason,
    ) -> None:
        super().__init__(message)
        self.request = request
        self.response = response
        self.reason: GiveUpReason = reason


class LimiterTimeout(TimeoutException):
    """The transport's limiter had no token for the first attempt within ``max_time``:
    nothing was sent. (For a retry, the last response is handed back instead.)"""

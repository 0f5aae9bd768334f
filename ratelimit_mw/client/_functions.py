"""One-off calls with retries, for scripts that do not keep a client around."""

from __future__ import annotations

from typing import Any

import httpx

from ._budget import RetryBudget
from ._policy import RetryPolicy
from ._transport import RetryTransport

__all__ = ["arequest", "request"]


def request(
    method: str,
    url: httpx.URL | str,
    *,
    policy: RetryPolicy | None = None,
    retry_budget: RetryBudget | None = None,
    transport: httpx.BaseTransport | None = None,
    **kwargs: Any,
) -> httpx.Response:
    """Send one request with retries and return the read response, like ``httpx.request``.

    ``kwargs`` go to ``httpx.Client.request`` (``params``, ``headers``, ``json``,
    ``timeout``, ``extensions``...); ``transport`` is wrapped instead of the
    default one.
    """
    retrying = RetryTransport(transport, policy=policy, retry_budget=retry_budget)
    with httpx.Client(transport=retrying) as client:
        return client.request(method, url, **kwargs)


async def arequest(
    method: str,
    url: httpx.URL | str,
    *,
    policy: RetryPolicy | None = None,
    retry_budget: RetryBudget | None = None,
    transport: httpx.AsyncBaseTransport | None = None,
    **kwargs: Any,
) -> httpx.Response:
    """Send one request with retries from async code; see :func:`request`."""
    retrying = RetryTransport(transport, policy=policy, retry_budget=retry_budget)
    async with httpx.AsyncClient(transport=retrying) as client:
        return await client.request(method, url, **kwargs)

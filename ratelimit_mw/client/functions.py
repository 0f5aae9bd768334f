"""One-off calls with retries, for scripts that do not keep a client around."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .budget import RetryBudget
from .libraries import DEFAULT_LIBRARY, library_of
from .policy import RetryPolicy
from .transport import RetryTransport

if TYPE_CHECKING:
    import httpx

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

    ``kwargs`` go to ``Client.request`` (``params``, ``headers``, ``json``,
    ``timeout``, ``extensions``...); ``transport`` is wrapped instead of the
    default one. The client is of ``transport``'s library, else httpx2 when it is
    installed, else httpx.
    """
    retrying = RetryTransport(transport, policy=policy, retry_budget=retry_budget)
    library = DEFAULT_LIBRARY if transport is None else library_of(transport)
    with library.Client(transport=retrying) as client:
        response: httpx.Response = client.request(method, url, **kwargs)
    return response


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
    library = DEFAULT_LIBRARY if transport is None else library_of(transport)
    async with library.AsyncClient(transport=retrying) as client:
        response: httpx.Response = await client.request(method, url, **kwargs)
    return response

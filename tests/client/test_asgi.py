"""The transport in front of an ASGI app, the way the middleware's end-to-end test will use it."""

from __future__ import annotations

from collections.abc import MutableMapping
from typing import Any

import httpx

from ratelimit_mw.client import RetryPolicy, RetryTransport

from .conftest import FakeClock


class LimitedApp:
    """A bare ASGI app allowing ``allowed`` requests, then 429 with Retry-After and RateLimit."""

    def __init__(self, allowed: int) -> None:
        self.allowed = allowed
        self.calls = 0

    async def __call__(self, scope: MutableMapping[str, Any], receive: Any, send: Any) -> None:
        assert scope["type"] == "http"
        self.calls += 1
        if self.calls > self.allowed:
            status, headers = 429, [(b"retry-after", b"3"), (b"ratelimit", b'"burst";r=0;t=3')]
            self.allowed = self.calls + 1  # the window resets: the next call passes
        else:
            status, headers = 200, [(b"ratelimit", b'"burst";r=1;t=3')]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": b"done"})


async def test_retry_transport_wraps_asgi_transport(clock: FakeClock) -> None:
    """RetryTransport(httpx.ASGITransport(app)) retries the app's 429 after its Retry-After."""
    app = LimitedApp(allowed=1)
    transport = RetryTransport(httpx.ASGITransport(app), clock=clock, async_sleep=clock.auto_sleep)
    async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as client:
        assert (await client.get("/")).status_code == 200
        response = await client.get("/")
    assert response.status_code == 200
    assert response.text == "done"
    assert app.calls == 3
    assert clock.sleeps == [3.0]


async def test_without_retries_the_429_is_visible(clock: FakeClock) -> None:
    """max_retries=0 lets a test see the limiter's own 429 and headers."""
    app = LimitedApp(allowed=0)
    transport = RetryTransport(httpx.ASGITransport(app), policy=RetryPolicy(max_retries=0))
    async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as client:
        response = await client.get("/")
    assert response.status_code == 429
    assert response.headers["retry-after"] == "3"

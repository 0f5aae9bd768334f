"""A real uvicorn server on a loopback port, deciding on the shared Redis."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator

import httpx
import pytest

from ratelimit_mw import Limit
from ratelimit_mw.tiers import Tier
from tests.servers import serve

from .conftest import make_app

pytestmark = pytest.mark.redis


@pytest.fixture
def server_url(redis_url: str, redis_prefix: str) -> Iterator[str]:
    """A uvicorn server (in a thread) running the middleware on Redis; its base URL."""
    tier = Tier("t", [Limit("1/second", "fixed_window", name="second"),
                      Limit("100/hour", name="hour")])
    app = make_app(tiers=[tier], storage_url=redis_url, storage_prefix=redis_prefix,
                   header_style="legacy+draft-11", failure_mode="closed")
    with serve(app) as url:
        yield url


@pytest.mark.slow
async def test_real_server_limits_and_waiting_retry_after_passes(server_url: str) -> None:
    """Over real HTTP: 200, then a 429 with Retry-After; waiting exactly that passes."""
    async with httpx.AsyncClient(base_url=server_url) as client:
        # Start just after a second boundary so the two requests share a window.
        await asyncio.sleep(1 - time.time() % 1 + 0.01)
        first = await client.get("/")
        denied = await client.get("/")
        assert first.status_code == 200
        assert first.headers["x-ratelimit-limit"] == "1"
        assert first.headers["x-ratelimit-remaining"] == "0"
        assert first.headers["ratelimit-policy"] == '"second";q=1;w=1,"hour";q=100;w=3600'
        assert first.headers["ratelimit"].startswith('"second";r=0;t=1,"hour";r=99;')
        assert denied.status_code == 429
        assert denied.headers["retry-after"] == "1"
        assert denied.headers["cache-control"] == "no-store"
        body = denied.json()
        assert body["error"] == "rate_limit_exceeded"
        assert body["retry_after_seconds"] == 1
        assert body["window"] == "1s"
        await asyncio.sleep(int(denied.headers["retry-after"]))
        again = await client.get("/")
    assert again.status_code == 200
    assert '"hour";r=98;' in again.headers["ratelimit"]


async def test_websocket_connects_over_the_limit_get_a_429(
    redis_url: str, redis_prefix: str,
) -> None:
    """limit_websockets on a real uvicorn (websockets-sansio): a connect over the limit
    is refused before the handshake with the 429 itself, headers and JSON body."""
    from starlette.routing import WebSocketRoute
    from starlette.websockets import WebSocket
    from websockets.asyncio.client import connect
    from websockets.exceptions import InvalidStatus

    async def echo(websocket: WebSocket) -> None:
        await websocket.accept()
        await websocket.send_text(await websocket.receive_text())
        await websocket.close()

    # A generous storage timeout: what is checked is the refusal, not Redis's latency
    # on a loaded host (a decision past 50 ms fails open, and the connect is let in).
    app = make_app([WebSocketRoute("/ws", echo)], tiers=[Tier("t", "1/minute")],
                   storage_url=redis_url, storage_prefix=redis_prefix, limit_websockets=True,
                   storage_timeout=2.0)
    with serve(app, ws="websockets-sansio") as url:
        address = url.replace("http://", "ws://") + "/ws"
        async with connect(address) as websocket:
            await websocket.send("hi")
            assert await websocket.recv() == "hi"
        with pytest.raises(InvalidStatus) as refused:
            async with connect(address):
                pass
    response = refused.value.response
    assert response.status_code == 429
    assert int(response.headers["retry-after"]) >= 1
    assert response.headers["x-ratelimit-remaining"] == "0"
    assert json.loads(response.body)["error"] == "rate_limit_exceeded"

"""Limits on the messages of websocket connections, over a real uvicorn: per connection,
per caller across its connections (on Redis, shared by workers), closed or dropped."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from starlette.routing import WebSocketRoute
from starlette.websockets import WebSocket, WebSocketDisconnect
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from ratelimit_mw import ConfigError, RateLimitSettings, Tier
from ratelimit_mw.metrics import PrometheusMetrics
from ratelimit_mw.socket_messages import CLOSE_REASON
from tests.servers import serve

from .conftest import make_app

pytestmark = pytest.mark.redis

TIERS = [Tier("t", "1000/minute")]


async def received(websocket: Any) -> Any:
    """The next message, or a failure (not a hang) when a message the test awaits was
    dropped."""
    return await asyncio.wait_for(websocket.recv(), 5)


def echo_app(seen: list[str], **options: Any) -> Any:
    """``/ws`` echoes each text message back (and notes it) until the client leaves."""
    async def echo(websocket: WebSocket) -> None:
        await websocket.accept()
        try:
            while True:
                text = await websocket.receive_text()
                seen.append(text)
                await websocket.send_text(text)
        except WebSocketDisconnect:
            pass

    return make_app([WebSocketRoute("/ws", echo)], tiers=TIERS, storage_timeout=2.0,
                    **options)


async def test_a_connection_over_its_message_limit_is_closed_with_1008(
    redis_url: str, redis_prefix: str,
) -> None:
    """Five messages a minute per connection: the sixth closes the socket with 1008 and
    the reason, unseen by the app; a new connection starts its own count."""
    seen: list[str] = []
    metrics = PrometheusMetrics()
    app = echo_app(seen, storage_url=redis_url, storage_prefix=redis_prefix,
                   websocket_connection_messages="5/minute", metrics=metrics)
    with serve(app, ws="websockets-sansio") as url:
        address = url.replace("http://", "ws://") + "/ws"
        async with connect(address) as websocket:
            for i in range(5):
                await websocket.send(f"m{i}")
                assert await websocket.recv() == f"m{i}"
            await websocket.send("m5")
            with pytest.raises(ConnectionClosed) as closed:
                await websocket.recv()
        async with connect(address) as again:
            await again.send("fresh")
            assert await again.recv() == "fresh"
    assert closed.value.rcvd is not None
    assert (closed.value.rcvd.code, closed.value.rcvd.reason) == (1008, CLOSE_REASON)
    assert seen == ["m0", "m1", "m2", "m3", "m4", "fresh"]
    assert metrics.registry.get_sample_value(
        "ratelimit_websocket_messages_refused_total",
        {"limit": "connection", "action": "closed"}) == 1


async def test_a_callers_limit_counts_all_of_its_connections(
    redis_url: str, redis_prefix: str,
) -> None:
    """Six messages a minute per caller: three connections of one client share them,
    on Redis; the seventh message, on any of them, closes that socket."""
    seen: list[str] = []
    app = echo_app(seen, storage_url=redis_url, storage_prefix=redis_prefix,
                   websocket_messages="6/minute")
    with serve(app, ws="websockets-sansio") as url:
        address = url.replace("http://", "ws://") + "/ws"
        async with connect(address) as a, connect(address) as b, connect(address) as c:
            for socket in (a, b, c, a, b, c):
                await socket.send("x")
                assert await socket.recv() == "x"
            await b.send("seventh")
            with pytest.raises(ConnectionClosed) as closed:
                await b.recv()
            await a.send("still-a")  # a is open, but the caller has nothing left
            with pytest.raises(ConnectionClosed):
                await a.recv()
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 1008
    assert seen == ["x"] * 6


async def test_dropped_messages_leave_the_connection_open(
    redis_url: str, redis_prefix: str,
) -> None:
    """``websocket_over_limit="drop"``: messages over the limit never reach the app,
    and the connection stays open for what the limit admits later."""
    seen: list[str] = []
    app = echo_app(seen, storage_url=redis_url, storage_prefix=redis_prefix,
                   websocket_connection_messages="2/second", websocket_over_limit="drop")
    with serve(app, ws="websockets-sansio") as url:
        address = url.replace("http://", "ws://") + "/ws"
        async with connect(address) as websocket:
            for text in ("a", "b", "c", "d"):
                await websocket.send(text)
            assert [await received(websocket) for _ in range(2)] == ["a", "b"]
            await asyncio.sleep(2.1)  # the counter's previous second has fully gone by
            await websocket.send("later")
            assert await received(websocket) == "later"
    assert seen == ["a", "b", "later"]


@pytest.mark.parametrize(("options", "match"), [
    ({"websocket_messages": "20/lightyear"}, "lightyear"),
    ({"websocket_connection_messages": "1/second; 5/minute"}, "several rates"),
    ({"websocket_over_limit": "shout"}, "websocket_over_limit"),
])
def test_a_bad_message_limit_fails_at_start_up(options: dict[str, Any], match: str) -> None:
    with pytest.raises((ConfigError, ValueError), match=match):
        RateLimitSettings(**options)

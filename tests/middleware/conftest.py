"""Helpers of the middleware tests: small apps, clients, and a Redis server of our own."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest
import redis as sync_redis
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

from ratelimit_mw import Limit, MemoryStorage, Tier, cost_from_state, spends
from ratelimit_mw.middleware import RateLimitMiddleware
from tests.conftest import FakeClock, free_port, middleware_arguments

CLIENT = ("203.0.113.7", 40000)


async def ok(request: Request) -> Response:
    return PlainTextResponse("ok")


async def stream(request: Request) -> Response:
    async def chunks() -> AsyncIterator[bytes]:
        for i in range(3):
            yield f"chunk{i};".encode()

    return StreamingResponse(chunks(), media_type="text/plain")


def make_app(endpoints: list[Any] | None = None, /, **options: Any) -> Starlette:
    """A Starlette app behind the middleware; ``/`` and ``/stream`` by default; setting
    fields among ``options`` go into its ``settings``."""
    app = Starlette(routes=endpoints or [Route("/", ok), Route("/stream", stream)])
    app.add_middleware(RateLimitMiddleware, **middleware_arguments(**options))
    return app


TOKENS = Limit("1000/minute", "token_bucket", name="tokens", unit="tokens",
               cost=cost_from_state("tokens"))


def token_stream_app(so_far: int, total: int, gate: threading.Event | None = None,
                     **options: Any) -> Starlette:
    """``/stream`` reports ``so_far`` tokens used and sends a word, waits for ``gate``
    (if given), then reports ``total`` in its last event; ``/quiet`` spends none of its
    100. Both spend from ``TOKENS``."""
    @spends("tokens", estimate=100)
    async def stream(request: Request) -> Response:
        async def events() -> AsyncIterator[bytes]:
            request.state.tokens = so_far
            yield b"data: first\n\n"
            if gate is not None:
                await asyncio.to_thread(gate.wait, 5)
            request.state.tokens = total
            yield f'data: {{"usage": {{"total_tokens": {total}}}}}\n\n'.encode()

        return StreamingResponse(events(), media_type="text/event-stream")

    @spends("tokens", estimate=100)
    async def quiet(request: Request) -> Response:
        request.state.tokens = 0
        return PlainTextResponse("")

    return make_app([Route("/stream", stream), Route("/quiet", quiet)],
                    tiers=[Tier("t", [TOKENS])], **options)


def client_for(app: Any, client: tuple[str, int] = CLIENT) -> httpx.AsyncClient:
    """An httpx client that talks to ``app`` in process, from ``client``."""
    transport = httpx.ASGITransport(app=app, client=client)
    return httpx.AsyncClient(transport=transport, base_url="http://test")


@pytest.fixture
def memory(clock: FakeClock) -> MemoryStorage:
    """A memory storage on the fake clock."""
    return MemoryStorage(clock=clock)


class RedisServer:
    """A redis-server subprocess of the test's own, to stop and start at will."""

    def __init__(self) -> None:
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.dir = tempfile.mkdtemp(prefix="rl-mw-redis-")
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        server = shutil.which("redis-server")
        if server is None:
            if os.environ.get("CI"):
                pytest.fail("redis-server is not installed")
            pytest.skip("redis-server is not installed")
        self.proc = subprocess.Popen(
            [server, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", self.dir],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while not self.answers():
            if time.monotonic() > deadline:
                pytest.fail("redis-server did not start")
            time.sleep(0.02)

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait(timeout=10)
            self.proc = None

    def answers(self) -> bool:
        client = sync_redis.Redis.from_url(self.url, socket_connect_timeout=0.2,
                                           socket_timeout=0.2)
        try:
            return bool(client.ping())
        except (sync_redis.RedisError, OSError):
            return False
        finally:
            client.close()


@pytest.fixture
def redis_server() -> Iterator[RedisServer]:
    """A Redis server of this test's own, already started."""
    server = RedisServer()
    server.start()
    try:
        yield server
    finally:
        server.stop()
        shutil.rmtree(server.dir, ignore_errors=True)

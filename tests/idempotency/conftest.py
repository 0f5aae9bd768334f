"""A test app behind IdempotencyMiddleware, served in-process or by a real uvicorn server.

The ``harness`` fixture runs every test it serves four times: memory or Redis store,
through ``httpx.ASGITransport`` or over a socket to uvicorn on a free loopback port.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import ASGIApp

from ratelimit_mw import RateLimitMiddleware
from ratelimit_mw.idempotency import (
    IdempotencyMiddleware,
    IdempotencyStore,
    MemoryIdempotencyStore,
    RedisIdempotencyStore,
)
from tests.conftest import FakeClock, free_port, middleware_arguments
from tests.middleware.conftest import redis_server  # noqa: F401 - a fixture of the outage tests


class Orders:
    """The endpoints under test: they count their runs and fail when told to."""

    def __init__(self) -> None:
        self.runs: Counter[str] = Counter()
        self.gate = threading.Event()  # cleared: create() waits (works across threads)
        self.gate.set()
        self.fail_status: int | None = None
        self.raise_next = False

    async def create(self, request: Request) -> Response:
        self.runs["create"] += 1
        number = self.runs["create"]
        body = await request.body()
        while not self.gate.is_set():
            await asyncio.sleep(0.005)
        if self.raise_next:
            self.raise_next = False
            raise RuntimeError("the handler crashed")
        if self.fail_status is not None:
            status, self.fail_status = self.fail_status, None
            return JSONResponse({"error": "upstream"}, status_code=status)
        return JSONResponse(
            {"order": number, "echo": body.decode("latin-1")},
            status_code=201,
            headers={"X-Order": str(number)},
        )

    async def count(self, request: Request) -> Response:
        self.runs["count"] += 1
        return JSONResponse({"count": self.runs["count"]})

    async def stream(self, request: Request) -> Response:
        self.runs["stream"] += 1

        async def chunks() -> AsyncIterator[bytes]:
            yield b"one,"
            yield b"two"

        return StreamingResponse(chunks(), media_type="text/plain")

    async def large(self, request: Request) -> Response:
        self.runs["large"] += 1
        return Response(b"x" * 2000, media_type="application/octet-stream")

    def app(self, store: IdempotencyStore, limiter: dict[str, Any] | None = None,
            **options: Any) -> Starlette:
        """A Starlette app with these endpoints behind the middleware (and behind a rate
        limiter of these options in front of it, if ``limiter`` is given)."""
        options.setdefault("required", ["/payments"])
        middleware = [Middleware(IdempotencyMiddleware, store=store, **options)]
        if limiter is not None:
            middleware.insert(0, Middleware(RateLimitMiddleware, **middleware_arguments(**limiter)))
        return Starlette(
            routes=[
                Route("/orders", self.create, methods=["POST", "PATCH"]),
                Route("/orders", self.count, methods=["GET", "HEAD"]),
                Route("/payments", self.create, methods=["POST"]),
                Route("/stream", self.stream, methods=["POST"]),
                Route("/large", self.large, methods=["POST"]),
            ],
            middleware=middleware,
        )


@contextlib.contextmanager
def uvicorn_serving(app: ASGIApp, store: IdempotencyStore) -> Iterator[str]:
    """Serve ``app`` with uvicorn on a free loopback port in a thread; yield its base URL.

    The server's loop owns the store's connections, so it closes the store itself.
    """
    port = free_port()
    config = uvicorn.Config(
        app, host="127.0.0.1", port=port, log_level="warning", lifespan="off", access_log=False
    )
    server = uvicorn.Server(config)

    async def main() -> None:
        try:
            await server.serve()
        finally:
            await store.close()

    thread = threading.Thread(target=asyncio.run, args=(main(),), daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            pytest.fail(f"uvicorn did not start on port {port}")
        time.sleep(0.005)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)


class Harness:
    """Builds the app on one store backend and serves it through one transport."""

    def __init__(self, backend: str, transport: str, clock: FakeClock, request: Any) -> None:
        self.backend = backend
        self.transport = transport
        self.clock = clock
        self.orders = Orders()
        self._request = request
        self.redis_prefix = ""

    def make_store(self) -> IdempotencyStore:
        if self.backend == "memory":
            return MemoryIdempotencyStore(clock=self.clock)
        url = self._request.getfixturevalue("redis_url")
        self.redis_prefix = self._request.getfixturevalue("redis_prefix")
        # What these tests check is the protocol, not latency (test_outage.py does that):
        # a generous timeout, so twenty claims connecting at once on a slow, loaded host
        # are not taken for an outage (0.25 s was, once, and the breaker opened).
        return RedisIdempotencyStore.from_url(url, prefix=self.redis_prefix, timeout=2.0)

    @contextlib.asynccontextmanager
    async def client(self, **options: Any) -> AsyncIterator[httpx.AsyncClient]:
        """A client for the app, built with these middleware options."""
        store = self.make_store()
        app = self.orders.app(store, **options)
        if self.transport == "asgi":
            transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
            try:
                async with httpx.AsyncClient(transport=transport, base_url="http://test") as c:
                    yield c
            finally:
                await store.close()
            return
        with uvicorn_serving(app, store) as url:
            async with httpx.AsyncClient(base_url=url, timeout=10) as c:
                yield c


@pytest.fixture(params=["memory", "redis"])
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(params=["asgi", "uvicorn"])
def transport(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def harness(
    request: pytest.FixtureRequest, backend: str, transport: str, clock: FakeClock
) -> Harness:
    """The app on every store backend, in-process and behind a real server.

    A test narrows the matrix with ``@pytest.mark.parametrize("backend", ["memory"])``.
    """
    return Harness(backend, transport, clock, request)

"""A request holding a concurrency slot, behind a real uvicorn: the slot comes back when
the client disconnects though the handler runs on, a HEAD's as soon as its response is
out, and the app still gets every message of its request."""

from __future__ import annotations

import asyncio
import hashlib
import socket
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest
from starlette.background import BackgroundTask
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

from ratelimit_mw import Hit, Limit, MemoryStorage, RedisStorage, Storage
from ratelimit_mw.tiers import Tier
from tests.servers import serve

from .conftest import make_app

KEY = "ip:127.0.0.1"

pytestmark = pytest.mark.slow


class Handlers:
    """Endpoints that take their time, and what they saw."""

    def __init__(self) -> None:
        self.finished: list[str] = []
        self.noticed: list[bool] = []

    async def slow(self, request: Request) -> Response:
        await asyncio.sleep(3)  # never reads: only a watcher can see the client leave
        self.finished.append("slow")
        return PlainTextResponse("slow")

    async def endless(self, request: Request) -> Response:
        async def body() -> AsyncIterator[bytes]:
            while True:
                yield b"x" * 1024
                await asyncio.sleep(0.01)

        async def after() -> None:
            await asyncio.sleep(2)
            self.finished.append("background")

        return StreamingResponse(body(), background=BackgroundTask(after))

    async def slow_body(self, request: Request) -> Response:
        async def body() -> AsyncIterator[bytes]:
            for _ in range(20):
                await asyncio.sleep(0.1)
                yield b"chunk;"

        return StreamingResponse(body(), media_type="text/plain")

    async def echo(self, request: Request) -> Response:
        await asyncio.sleep(1.5)  # the watcher reads meanwhile, for the app
        body = await request.body()
        return JSONResponse({"length": len(body), "sha256": hashlib.sha256(body).hexdigest()})

    async def waits_for_disconnect(self, request: Request) -> Response:
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            if await request.is_disconnected():
                self.noticed.append(True)
                break
            await asyncio.sleep(0.05)
        else:
            self.noticed.append(False)
        return PlainTextResponse("done")


@pytest.fixture(params=["memory", "redis", "redis-unpipelined"])
async def storages(request: pytest.FixtureRequest) -> AsyncIterator[tuple[Storage, Storage]]:
    """The server's storage (closed by the server), and one to read its slots from the
    test's own loop."""
    if request.param == "memory":
        memory = MemoryStorage()
        yield memory, memory
        return
    url = request.getfixturevalue("redis_url")
    prefix = request.getfixturevalue("redis_prefix")
    # max_connections: a plain connection pool, no pipeline; its give-back is awaited.
    options: dict[str, Any] = {"max_connections": 10} if request.param.endswith("d") else {}
    reader = RedisStorage.from_url(url, prefix=prefix, timeout=1.0)
    yield RedisStorage.from_url(url, prefix=prefix, timeout=1.0, **options), reader
    await reader.close()


@pytest.fixture
def server(storages: tuple[Storage, Storage]) -> Iterator[tuple[str, Handlers, Storage]]:
    """uvicorn (in a thread) with a tier of one slot."""
    handlers = Handlers()
    storage = storages[0]
    app = make_app([Route("/slow", handlers.slow), Route("/endless", handlers.endless),
                    Route("/slow-body", handlers.slow_body),
                    Route("/echo", handlers.echo, methods=["POST"]),
                    Route("/waits", handlers.waits_for_disconnect),
                    Route("/", lambda request: PlainTextResponse("ok"))],
                   tiers=[Tier("t", "1000/minute", concurrency=1)], storage=storage,
                   # Generous: a decision that times out on a loaded host takes no slot.
                   storage_timeout=1.0)

    async def closing(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "lifespan":
            await app(scope, receive, send)
            return
        while (await receive())["type"] != "lifespan.shutdown":
            await send({"type": "lifespan.startup.complete"})
        await storage.close()
        await send({"type": "lifespan.shutdown.complete"})

    with serve(closing) as url:
        yield url, handlers, storages[1]


async def taken(storage: Storage) -> int:
    verdict = await storage.peek(KEY, [Hit(Limit.concurrency(1))])
    return 1 - verdict.decisions[0].remaining


async def hang_up_after(url: str, path: str, seconds: float) -> None:
    """Send a GET, then close the connection before the answer."""
    host, port = url.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)))
    sock.sendall(f"GET {path} HTTP/1.1\r\nHost: test\r\n\r\n".encode())
    await asyncio.sleep(seconds)
    sock.close()


async def freed_within(storage: Storage, seconds: float) -> float:
    """Seconds until the slot is free again (fails after ``seconds``)."""
    start = time.monotonic()
    while await taken(storage):
        assert time.monotonic() - start < seconds, "the slot was not given back"
        await asyncio.sleep(0.02)
    return time.monotonic() - start


async def test_a_client_gone_from_a_slow_handler_frees_its_slot(
    server: tuple[str, Handlers, Storage],
) -> None:
    """A handler that never reads runs 3 s; its client leaves at 0.3 s: the slot is free
    within about a second while the handler still runs, and the next request passes."""
    url, handlers, storage = server
    await hang_up_after(url, "/slow", 0.3)
    assert await taken(storage) == 1
    await freed_within(storage, 2.0)
    assert handlers.finished == []  # still running
    async with httpx.AsyncClient(base_url=url, timeout=5) as client:
        assert (await client.get("/")).status_code == 200


async def test_a_client_gone_mid_stream_frees_the_slot_before_the_background_task(
    server: tuple[str, Handlers, Storage],
) -> None:
    """A streaming response with a background task: the client leaves mid-stream; the
    slot comes back though the background task runs on for 2 s."""
    url, handlers, storage = server
    async with httpx.AsyncClient(base_url=url, timeout=5) as client:
        async with client.stream("GET", "/endless") as streaming:
            assert streaming.status_code == 200
            assert (await client.get("/")).status_code == 429
        await freed_within(storage, 1.5)
        assert handlers.finished == []
        assert (await client.get("/")).status_code == 200


async def test_a_head_request_frees_its_slot_when_its_response_is_out(
    server: tuple[str, Handlers, Storage],
) -> None:
    """HEAD on a streaming route: the body is never sent, so the slot comes back with the
    response's start, not when the app's 2 s generator ends."""
    url, _, _ = server
    async with (httpx.AsyncClient(base_url=url, timeout=5) as client,
                httpx.AsyncClient(base_url=url, timeout=5) as other):
        head = await client.head("/slow-body")
        # On another connection: uvicorn holds a request pipelined behind the HEAD on
        # the same one until the HEAD's app call ends.
        start = time.monotonic()
        after = await other.get("/")
        took = time.monotonic() - start
    assert head.status_code == 200
    assert after.status_code == 200
    assert took < 1.0


async def test_the_app_gets_its_whole_body_though_a_watcher_read_it(
    server: tuple[str, Handlers, Storage],
) -> None:
    """A handler that reads its 1 MB body only after 1.5 s (the watcher started at 1 s
    and read on its behalf) gets every byte, in order."""
    url, _, storage = server
    body = bytes(range(256)) * 4096
    async with httpx.AsyncClient(base_url=url, timeout=10) as client:
        response = await client.post("/echo", content=body)
    assert response.status_code == 200
    assert response.json() == {"length": len(body), "sha256": hashlib.sha256(body).hexdigest()}
    assert await taken(storage) == 0


async def test_the_app_still_sees_the_disconnect_the_watcher_saw(
    server: tuple[str, Handlers, Storage],
) -> None:
    """request.is_disconnected() in a handler that polls it still learns that its client
    left, and the slot is back by then."""
    url, handlers, storage = server
    await hang_up_after(url, "/waits", 1.5)
    deadline = time.monotonic() + 5
    while not handlers.noticed:
        assert time.monotonic() < deadline, "the handler never returned"
        await asyncio.sleep(0.02)
    assert handlers.noticed == [True]
    await freed_within(storage, 1.0)

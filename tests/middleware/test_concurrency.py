"""Tier concurrency: a slot per request in flight, taken with the rate limits in one
call, given back when the response ends, the client goes away or the app raises."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest
import uvicorn
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

from ratelimit_mw import Hit, Limit, MemoryStorage, RateLimitSettings, RedisStorage, Storage
from ratelimit_mw.middleware import RateLimitMiddleware
from ratelimit_mw.tiers import Tier
from tests.conftest import FakeClock, free_port
from tests.redis_servers import delayed
from tests.wire_recording import Writes, recording_storage

from .conftest import CLIENT, client_for, make_app

KEY = f"ip:{CLIENT[0]}"


class Gate:
    """Endpoints that wait until the test opens the gate."""

    def __init__(self) -> None:
        self.open = asyncio.Event()
        self.entered = 0

    async def wait(self, request: Request) -> Response:
        self.entered += 1
        await self.open.wait()
        return PlainTextResponse("done")

    async def fail(self, request: Request) -> Response:
        msg = "the app broke"
        raise RuntimeError(msg)

    def routes(self) -> list[Route]:
        return [Route("/wait", self.wait), Route("/fail", self.fail),
                Route("/", lambda request: PlainTextResponse("ok"))]


async def in_flight(storage: Storage, capacity: int, key: str = KEY, lease: float = 30.0) -> int:
    """The slots of ``key`` taken right now, read without taking one."""
    verdict = await storage.peek(key, [Hit(Limit.concurrency(capacity, lease=lease))])
    return capacity - verdict.decisions[0].remaining


async def until(predicate: Any, timeout: float = 2.0) -> None:
    deadline = time.monotonic() + timeout
    while not await predicate():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.01)


async def test_third_request_in_flight_is_429_and_slots_come_back(
    clock: FakeClock, memory: MemoryStorage,
) -> None:
    """Capacity 2: two held requests, the third is a 429 reported as a concurrent
    policy; when they end, both slots are free again."""
    gate = Gate()
    app = make_app(gate.routes(), tiers=[Tier("t", "100/minute", concurrency=2)],
                   storage=memory, clock=clock, header_style="legacy+draft-11")
    async with client_for(app) as client:
        held = [asyncio.ensure_future(client.get("/wait")) for _ in range(2)]
        await until(lambda: _true(gate.entered == 2))
        denied = await client.get("/")
        assert await in_flight(memory, 2) == 2
        gate.open.set()
        done = await asyncio.gather(*held)
        assert await in_flight(memory, 2) == 0
        after = await client.get("/")
    assert [r.status_code for r in done] == [200, 200]
    assert done[0].headers["ratelimit"].endswith('"concurrent";r=1')
    assert denied.status_code == 429
    assert denied.headers["retry-after"] == "1"
    assert denied.headers["ratelimit-policy"] == (
        '"100-per-minute";q=100;w=60,"concurrent";q=2;qu="concurrent-requests"')
    assert denied.headers["ratelimit"].endswith('"concurrent";r=0;t=1')
    assert denied.headers["x-ratelimit-limit"] == "2"
    body = denied.json()
    assert body["message"] == (
        "Too many requests in flight. You may have at most 2 concurrent requests.")
    assert (body["limit"], body["window"], body["retry_after_seconds"]) == (2, None, 1)
    assert after.status_code == 200
    # An admitted response reports the rate limit, not the free slots, in legacy headers.
    assert after.headers["x-ratelimit-limit"] == "100"


async def _true(value: bool) -> bool:
    return value


async def test_slot_comes_back_when_the_app_raises(
    clock: FakeClock, memory: MemoryStorage,
) -> None:
    """An exception in the app still gives the slot back."""
    app = make_app(Gate().routes(), tiers=[Tier("t", "100/minute", concurrency=1)],
                   storage=memory, clock=clock)
    async with client_for(app) as client:
        with pytest.raises(RuntimeError, match="the app broke"):
            await client.get("/fail")
        assert await in_flight(memory, 1) == 0
        assert (await client.get("/")).status_code == 200


async def test_full_slot_consumes_no_rate_and_is_never_cached_as_blocked(
    clock: FakeClock, memory: MemoryStorage,
) -> None:
    """Denied by the slot: the rate limit is untouched, and the denial is not kept in the
    blocked-keys cache (the next request after a slot frees passes at the same instant)."""
    gate = Gate()
    tier = Tier("t", [Limit("3/minute", "fixed_window", name="rate")], concurrency=1)
    app = make_app(gate.routes(), tiers=[tier], storage=memory, clock=clock)
    async with client_for(app) as client:
        held = asyncio.ensure_future(client.get("/wait"))
        await until(lambda: _true(gate.entered == 1))
        denied = [(await client.get("/")).status_code for _ in range(3)]
        gate.open.set()
        await held
        passed = await client.get("/")
    assert denied == [429, 429, 429]
    assert passed.status_code == 200
    assert passed.headers["x-ratelimit-remaining"] == "1"  # 3 - /wait - this one


async def test_rate_denial_takes_no_slot(clock: FakeClock, memory: MemoryStorage) -> None:
    """Over the rate limit: 429 from the rate, and no slot is held afterwards."""
    tier = Tier("t", [Limit("1/minute", "fixed_window")], concurrency=5)
    app = make_app(Gate().routes(), tiers=[tier], storage=memory, clock=clock)
    async with client_for(app) as client:
        assert (await client.get("/")).status_code == 200
        denied = await client.get("/")
    assert denied.status_code == 429
    assert denied.json()["window"] == "60s"
    assert await in_flight(memory, 5) == 0


async def test_shadow_only_denial_still_takes_and_returns_a_slot(
    clock: FakeClock, memory: MemoryStorage,
) -> None:
    """A request let through by a shadow limit is decided again on the enforced limits,
    slot included, and gives that slot back."""
    gate = Gate()
    tier = Tier("t", [Limit("1/minute", "fixed_window", name="trial")],
                concurrency=1, shadow=frozenset({"trial"}))
    app = make_app(gate.routes(), tiers=[tier], storage=memory, clock=clock)
    async with client_for(app) as client:
        assert (await client.get("/")).status_code == 200
        held = asyncio.ensure_future(client.get("/wait"))  # over "trial": shadow only
        await until(lambda: _true(gate.entered == 1))
        assert await in_flight(memory, 1) == 1
        assert (await client.get("/")).status_code == 429  # the slot is enforced
        gate.open.set()
        assert (await held).status_code == 200
    assert await in_flight(memory, 1) == 0


async def test_lease_setting_and_route_cost_shape_the_slot(
    clock: FakeClock, memory: MemoryStorage,
) -> None:
    """``concurrency_lease`` sets the lease; a route's cost never takes more than one slot."""
    gate = Gate()
    tier = Tier("t", "100/minute", concurrency=1)
    app = make_app(gate.routes(), tiers=[tier], storage=memory, clock=clock,
                   concurrency_lease=5.0)
    async with client_for(app) as client:
        held = asyncio.ensure_future(client.get("/wait"))
        await until(lambda: _true(gate.entered == 1))
        assert await in_flight(memory, 1, lease=5.0) == 1
        clock.advance(5.01)  # a lease not given back frees itself
        assert await in_flight(memory, 1, lease=5.0) == 0
        gate.open.set()
        await held


def test_a_bad_lease_fails_at_start() -> None:
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="concurrency_lease must be a positive"):
        RateLimitMiddleware(
            make_app(),
            tiers=[Tier("t", "1/minute")],
            settings=RateLimitSettings(concurrency_lease=0),
        )


# -- storage down: the failure mode decides ---------------------------------------------

def _dead_redis() -> str:
    return f"redis://127.0.0.1:{free_port()}/0"


async def _one_slot_while_storage_down(mode: str) -> tuple[int, int, int]:
    """Storage down, one slot: the statuses of a request holding it, of one arriving
    meanwhile, and of one after the first has ended."""
    gate = Gate()
    app = make_app(gate.routes(), tiers=[Tier("t", "100/minute", concurrency=1)],
                   storage_url=_dead_redis(), storage_timeout=0.2, failure_mode=mode)
    async with client_for(app) as client:
        held = asyncio.ensure_future(client.get("/wait"))
        await until(lambda: _true(gate.entered == 1))
        second = await client.get("/")
        gate.open.set()
        first = await held
        third = await client.get("/")
    return first.status_code, second.status_code, third.status_code


async def test_storage_down_open_mode_skips_slots() -> None:
    """``open``: while the storage is down requests pass undecided, slots included."""
    first, second, _ = await _one_slot_while_storage_down("open")
    assert (first, second) == (200, 200)


async def test_storage_down_memory_mode_enforces_and_returns_local_slots() -> None:
    """``memory``: the local fallback takes the slots, and they go back to it."""
    assert await _one_slot_while_storage_down("memory") == (200, 429, 200)


async def test_storage_down_closed_mode_refuses() -> None:
    app = make_app(Gate().routes(), tiers=[Tier("t", "100/minute", concurrency=1)],
                   storage_url=_dead_redis(), storage_timeout=0.2, failure_mode="closed")
    async with client_for(app) as client:
        assert (await client.get("/")).status_code == 503


# -- on Redis ---------------------------------------------------------------------------

@pytest.mark.redis
async def test_redis_slots_are_taken_atomically_and_given_back(
    redis_url: str, redis_prefix: str,
) -> None:
    """On Redis: a rate denial takes no slot, a slot denial consumes no rate, and every
    slot is back (ZREM) after the requests end; usage is counted in the same call."""
    gate = Gate()
    storage = RedisStorage.from_url(redis_url, prefix=redis_prefix)
    tier = Tier("t", [Limit("3/minute", "fixed_window", name="rate")], concurrency=1)
    app = make_app(gate.routes(), tiers=[tier], storage=storage, quota_history=True,
                   storage_timeout=5.0)  # a loaded host: no decision fails open
    try:
        async with client_for(app) as client:
            held = asyncio.ensure_future(client.get("/wait"))
            await until(lambda: _true(gate.entered == 1))
            assert await in_flight(storage, 1) == 1
            slot_denied = await client.get("/")
            gate.open.set()
            assert (await held).status_code == 200
            assert await in_flight(storage, 1) == 0
            codes = [(await client.get("/")).status_code for _ in range(3)]
            assert await in_flight(storage, 1) == 0
        now = time.time()
        day = await storage.usage(KEY, "day", now, now)
    finally:
        await storage.close()
    assert slot_denied.status_code == 429
    assert codes == [200, 200, 429]  # 3/minute: /wait, then two; the slot denial cost none
    assert day[0][1] == 3  # admitted requests only


# -- a real server: streaming bodies and disconnects ------------------------------------

@pytest.fixture
def stream_server(memory_wall: MemoryStorage) -> Iterator[tuple[str, threading.Event]]:
    """uvicorn (in a thread) with a tier of one slot, and endpoints that stream."""
    release = threading.Event()

    async def held_stream(request: Request) -> Response:
        async def body() -> AsyncIterator[bytes]:
            yield b"first;"
            while not release.is_set():
                await asyncio.sleep(0.01)
            yield b"last"

        return StreamingResponse(body(), media_type="text/plain")

    async def endless(request: Request) -> Response:
        async def body() -> AsyncIterator[bytes]:
            while True:
                yield b"x" * 1024
                await asyncio.sleep(0.01)

        return StreamingResponse(body(), media_type="text/plain")

    app = make_app([Route("/held", held_stream), Route("/endless", endless),
                    Route("/", lambda request: PlainTextResponse("ok"))],
                   tiers=[Tier("t", "1000/minute", concurrency=1)], storage=memory_wall)
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port,
                                           log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "uvicorn did not start"
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{port}", release
    finally:
        release.set()
        server.should_exit = True
        thread.join(timeout=10)


@pytest.fixture
def memory_wall() -> MemoryStorage:
    return MemoryStorage()


async def test_streaming_response_holds_its_slot_until_the_body_ends(
    stream_server: tuple[str, threading.Event],
) -> None:
    url, release = stream_server
    async with httpx.AsyncClient(base_url=url, timeout=5) as client:
        async with client.stream("GET", "/held") as streaming:
            chunks = streaming.aiter_bytes()
            assert (await anext(chunks)).startswith(b"first;")
            during = await client.get("/")
            release.set()
            rest = b"".join([chunk async for chunk in chunks])
        after = await client.get("/")
    assert during.status_code == 429
    assert rest.endswith(b"last")
    assert after.status_code == 200


async def test_client_disconnect_gives_the_slot_back(
    stream_server: tuple[str, threading.Event], memory_wall: MemoryStorage,
) -> None:
    """A client that goes away mid-stream: the stream stops and its slot comes back."""
    url, _ = stream_server
    async with httpx.AsyncClient(base_url=url, timeout=5) as client:
        async with client.stream("GET", "/endless") as streaming:
            assert streaming.status_code == 200  # headers are in; the body never ends
            assert (await client.get("/")).status_code == 429
        # Leaving the block mid-body closed the connection.
        await until(lambda: _free(memory_wall), timeout=5)
        assert (await client.get("/")).status_code == 200


async def _free(storage: MemoryStorage) -> bool:
    return await in_flight(storage, 1, key="ip:127.0.0.1") == 0


async def test_websocket_holds_its_slot_while_connected(
    clock: FakeClock, memory: MemoryStorage,
) -> None:
    """With limit_websockets, a connection holds a slot until it ends: a second connect
    meanwhile is closed with 1008, and one after it is accepted."""
    from starlette.routing import WebSocketRoute
    from starlette.websockets import WebSocket

    hang_up = asyncio.Event()

    async def chat(websocket: WebSocket) -> None:
        await websocket.accept()
        await hang_up.wait()
        await websocket.close()

    app = make_app([WebSocketRoute("/ws", chat)], tiers=[Tier("t", "100/minute", concurrency=1)],
                   storage=memory, clock=clock, limit_websockets=True)

    async def connect() -> list[Any]:
        sent: list[Any] = []
        incoming = [{"type": "websocket.connect"}]

        async def receive() -> Any:
            if incoming:
                return incoming.pop(0)
            await hang_up.wait()
            return {"type": "websocket.disconnect", "code": 1000}

        async def send(message: Any) -> None:
            sent.append(message)

        scope = {"type": "websocket", "path": "/ws", "raw_path": b"/ws", "root_path": "",
                 "scheme": "ws", "query_string": b"", "headers": [], "client": CLIENT,
                 "server": ("test", 80), "subprotocols": [], "asgi": {"version": "3.0"}}
        await app(scope, receive, send)
        return sent

    first = asyncio.ensure_future(connect())
    await until(lambda: in_flight_is(memory, 1))
    refused = await connect()
    hang_up.set()
    accepted = await first
    after = await connect()
    assert refused == [{"type": "websocket.close", "code": 1008, "reason": "rate limit exceeded"}]
    assert accepted[0]["type"] == "websocket.accept"
    assert after[0]["type"] == "websocket.accept"
    assert await in_flight(memory, 1) == 0
    # An accepted connection is a limited response too: the accept carries the headers.
    assert (b"x-ratelimit-limit", b"100") in accepted[0]["headers"]


async def test_websocket_denial_response_where_the_server_offers_it(
    clock: FakeClock, memory: MemoryStorage,
) -> None:
    """With the ASGI websocket.http.response extension, a refused connect gets the 429
    (headers and body) instead of a bare close."""
    from starlette.routing import WebSocketRoute
    from starlette.websockets import WebSocket

    async def chat(websocket: WebSocket) -> None:
        await websocket.accept()
        await websocket.close()

    app = make_app([WebSocketRoute("/ws", chat)], tiers=[Tier("t", "1/minute")],
                   storage=memory, clock=clock, limit_websockets=True)

    async def connect() -> list[Any]:
        sent: list[Any] = []
        incoming = [{"type": "websocket.connect"}, {"type": "websocket.disconnect", "code": 1000}]

        async def receive() -> Any:
            return incoming.pop(0)

        async def send(message: Any) -> None:
            sent.append(message)

        scope = {"type": "websocket", "path": "/ws", "raw_path": b"/ws", "root_path": "",
                 "scheme": "ws", "query_string": b"", "headers": [], "client": CLIENT,
                 "server": ("test", 80), "subprotocols": [], "asgi": {"version": "3.0"},
                 "extensions": {"websocket.http.response": {}}}
        await app(scope, receive, send)
        return sent

    assert (await connect())[0]["type"] == "websocket.accept"
    start, body = await connect()
    assert start["type"] == "websocket.http.response.start" and start["status"] == 429
    headers = dict(start["headers"])
    assert int(headers[b"retry-after"]) > 0 and headers[b"x-ratelimit-remaining"] == b"0"
    assert body["type"] == "websocket.http.response.body"
    assert json.loads(body["body"])["error"] == "rate_limit_exceeded"

    # A custom denial response (Starlette sends it as a websocket denial itself) gets the
    # same rate-limit headers.
    from starlette.responses import PlainTextResponse

    app = make_app([WebSocketRoute("/ws", chat)], tiers=[Tier("t", "1/minute")],
                   storage=memory, clock=clock, limit_websockets=True,
                   on_denied=lambda scope, denial: PlainTextResponse("slow down", 429))
    start, body = await connect()
    assert start["type"] == "websocket.http.response.start" and start["status"] == 429
    headers = dict(start["headers"])
    assert int(headers[b"retry-after"]) > 0 and headers[b"x-ratelimit-remaining"] == b"0"
    assert body["body"] == b"slow down"


async def in_flight_is(storage: MemoryStorage, expected: int) -> bool:
    return await in_flight(storage, 1) == expected


@pytest.mark.redis
async def test_redis_many_requests_ending_together_all_give_back(
    redis_url: str, redis_prefix: str,
) -> None:
    """Twenty requests that end in the same instant: every slot is back afterwards
    (their releases share one pipelined round trip)."""
    gate = Gate()
    # A generous timeout: 20 decisions at once on a loaded 2-core host are no failure.
    storage = RedisStorage.from_url(redis_url, prefix=redis_prefix, timeout=2.0)
    app = make_app(gate.routes(), tiers=[Tier("t", "1000/minute", concurrency=20)],
                   storage=storage, storage_timeout=2.0)
    try:
        async with client_for(app) as client:
            held = [asyncio.ensure_future(client.get("/wait")) for _ in range(20)]
            await until(lambda: _true(gate.entered == 20))
            assert await in_flight(storage, 20) == 20
            assert (await client.get("/")).status_code == 429
            gate.open.set()
            assert [r.status_code for r in await asyncio.gather(*held)] == [200] * 20
            assert await in_flight(storage, 20) == 0
    finally:
        await storage.close()


@pytest.mark.slow
async def test_redis_give_back_does_not_wait_for_redis_yet_comes_first(
    redis_url: str, redis_prefix: str,
) -> None:
    """Through a proxy with a 400 ms round trip: a request that holds a slot costs one
    round trip, not two (its give-back is not waited for), and the next request, sent
    as soon as the first one ends, still finds the single slot free (the give-back
    reaches Redis before that request's decision)."""
    async with delayed(redis_url, 0.2) as url:
        storage = RedisStorage.from_url(url, prefix=redis_prefix, timeout=3.0)
        app = make_app([Route("/", lambda request: PlainTextResponse("ok"))],
                       tiers=[Tier("t", "1000/minute", concurrency=1)], storage=storage,
                       storage_timeout=3.0)
        try:
            async with client_for(app) as client:
                assert (await client.get("/")).status_code == 200  # connected, script loaded
                times, codes = [], []
                for _ in range(3):
                    start = time.monotonic()
                    codes.append((await client.get("/")).status_code)
                    times.append(time.monotonic() - start)
                assert await in_flight(storage, 1) == 0
        finally:
            await storage.close()
    assert codes == [200, 200, 200]
    assert all(0.4 <= took < 0.7 for took in times), times


async def test_redis_give_back_is_written_before_the_end_of_the_response(
    redis_url: str, redis_prefix: str,
) -> None:
    """The slot's ZREM leaves for Redis before the last body chunk is sent: another
    worker that the client turns to next finds the slot free, unless this worker's
    path to Redis is slower than the client's round trip to that worker."""
    events: list[str] = []
    writes = Writes()
    storage = recording_storage(redis_url, writes, prefix=redis_prefix, timeout=1.0)
    middleware = RateLimitMiddleware(
        PlainTextResponse("ok"), tiers=[Tier("t", "1000/minute", concurrency=1)],
        storage=storage)

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: Any) -> None:
        if message["type"] == "http.response.body" and not message.get("more_body"):
            events.extend(["zrem"] * writes.commands().count(b"ZREM"))
            events.append("end of response")

    scope = {"type": "http", "method": "GET", "path": "/", "headers": [],
             "query_string": b"", "client": CLIENT}
    try:
        await middleware(scope, receive, send)
        assert events == ["zrem", "end of response"]
        assert await in_flight(storage, 1) == 0
    finally:
        await storage.close()


@pytest.mark.parametrize("kind", ["memory", "redis"])
async def test_a_background_task_after_the_response_holds_no_slot(
    redis_url: str, redis_prefix: str, kind: str,
) -> None:
    """The slot goes back just before the last body chunk: work the app does after its
    response (a Starlette background task) does not keep the next request out."""
    storage: Storage = (MemoryStorage() if kind == "memory"
                        else RedisStorage.from_url(redis_url, prefix=redis_prefix, timeout=1.0))
    seen_during_task: list[int] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"done"})
        seen_during_task.append(await in_flight(storage, 1))  # the background task

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: Any) -> None:
        pass

    middleware = RateLimitMiddleware(app, tiers=[Tier("t", "1000/minute", concurrency=1)],
                                     storage=storage)
    scope = {"type": "http", "method": "GET", "path": "/", "headers": [],
             "query_string": b"", "client": CLIENT}
    try:
        await middleware(scope, receive, send)
        assert seen_during_task == [0]
        assert await in_flight(storage, 1) == 0
    finally:
        await storage.close()


@pytest.mark.parametrize("ending", ["raises", "cancelled", "no body"])
async def test_redis_slot_comes_back_however_the_app_call_ends(
    redis_url: str, redis_prefix: str, ending: str,
) -> None:
    """On pipelined Redis (slots given back without awaiting): an app that raises after
    its response started, one cancelled (a client gone), or one that never sends a body
    still gives its slot back, once, and its own outcome is what the server sees; the
    response start carries the rate-limit headers."""
    writes = Writes()
    storage = recording_storage(redis_url, writes, prefix=redis_prefix, timeout=1.0)
    sent: list[dict[str, Any]] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        if ending == "raises":
            raise RuntimeError("the app broke")
        if ending == "cancelled":
            raise asyncio.CancelledError

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: Any) -> None:
        sent.append(message)

    # A generous timeout: a garbage collection of the test process (50 ms and more
    # here) must not time the first decision out (it would take no slot).
    middleware = RateLimitMiddleware(
        app,
        tiers=[Tier("t", "1000/minute", concurrency=1)],
        storage=storage,
        settings=RateLimitSettings(storage_timeout=1.0),
    )
    scope = {"type": "http", "method": "GET", "path": "/", "headers": [],
             "query_string": b"", "client": CLIENT}
    try:
        if ending == "no body":
            await middleware(scope, receive, send)
        else:
            expected = RuntimeError if ending == "raises" else asyncio.CancelledError
            with pytest.raises(expected):
                await middleware(scope, receive, send)
        assert await in_flight(storage, 1) == 0
        assert writes.commands().count(b"ZREM") == 1
        assert (b"x-ratelimit-limit", b"1000") in sent[0]["headers"]
    finally:
        await storage.close()


async def test_closing_the_storage_right_after_a_response_still_gives_its_slot_back(
    redis_url: str, redis_prefix: str, caplog: pytest.LogCaptureFixture,
) -> None:
    """A request ends and the storage is closed at once (a lifespan shutdown, a test's
    teardown): its slot is back in Redis, and no failed give-back is logged."""
    storage = RedisStorage.from_url(redis_url, prefix=redis_prefix, timeout=1.0)
    app = make_app([Route("/", lambda request: PlainTextResponse("ok"))],
                   tiers=[Tier("t", "1000/minute", concurrency=1)], storage=storage)
    async with client_for(app) as client:
        assert (await client.get("/")).status_code == 200
        await storage.close()
    try:
        assert await in_flight(storage, 1) == 0
    finally:
        await storage.close()
    assert "slot release failed" not in caplog.text


@pytest.mark.redis
async def test_redis_gone_before_release_is_logged_not_raised(
    redis_server: Any, caplog: pytest.LogCaptureFixture,
) -> None:
    """Redis stops while a request holds its slot: the response is still sent, and the
    failed give-back is a warning (the lease frees the slot)."""
    gate = Gate()
    storage = RedisStorage.from_url(redis_server.url, timeout=0.5)
    app = make_app(gate.routes(), tiers=[Tier("t", "100/minute", concurrency=1)],
                   storage=storage, storage_timeout=0.5)
    try:
        async with client_for(app) as client:
            held = asyncio.ensure_future(client.get("/wait"))
            await until(lambda: _true(gate.entered == 1))
            redis_server.stop()
            gate.open.set()
            response = await held
    finally:
        await storage.close()
    assert response.status_code == 200
    assert "ratelimit_mw slot release failed: event=slot_release_failed" in caplog.text


class _ReleaseFails(MemoryStorage):
    """Memory storage that cannot give slots back (as if its server had gone)."""

    async def release(self, leases: Any) -> None:
        raise ConnectionError("storage down during release")


@pytest.mark.parametrize("kind", ["http", "websocket"])
async def test_the_apps_own_error_survives_a_failed_give_back(
    kind: str, caplog: pytest.LogCaptureFixture,
) -> None:
    """The app raises while its slot can't be given back: the app's error is what
    propagates (in the compiled build too), the failed give-back is only logged."""
    async def app(scope: Any, receive: Any, send: Any) -> None:
        raise RuntimeError("the app's own error")

    async def receive() -> dict[str, Any]:
        return {"type": f"{kind}.disconnect"}

    async def send(message: Any) -> None:
        pass

    middleware = RateLimitMiddleware(
        app,
        tiers=[Tier("t", "5/minute", concurrency=2)],
        storage=_ReleaseFails(),
        settings=RateLimitSettings(limit_websockets=True),
    )
    scope = {"type": kind, "method": "GET", "path": "/", "headers": [], "query_string": b"",
             "client": CLIENT}
    with pytest.raises(RuntimeError, match="the app's own error"):
        await middleware(scope, receive, send)
    assert "ratelimit_mw slot release failed: event=slot_release_failed" in caplog.text


@pytest.fixture(params=["memory", pytest.param("redis", marks=pytest.mark.redis)])
async def real_time_storage(request: pytest.FixtureRequest) -> AsyncIterator[Storage]:
    """Memory or Redis storage on the real clock (leases renew on the event loop's)."""
    if request.param == "memory":
        yield MemoryStorage()
        return
    storage = RedisStorage.from_url(request.getfixturevalue("redis_url"),
                                    prefix=request.getfixturevalue("redis_prefix"),
                                    timeout=2.0)
    yield storage
    await storage.close()


@pytest.mark.slow
async def test_a_request_longer_than_its_lease_keeps_its_slot(
    real_time_storage: Storage,
) -> None:
    """Lease 1.2 s, one slot: a request held for 2.1 s keeps its slot all along (its
    lease is renewed while it runs), so a second request meanwhile is refused; the slot
    is back once it ends."""
    storage = real_time_storage
    gate = Gate()
    app = make_app(gate.routes(), tiers=[Tier("t", "1000/minute", concurrency=1)],
                   storage=storage, concurrency_lease=1.2, storage_timeout=2.0)
    async with client_for(app) as client:
        held = asyncio.ensure_future(client.get("/wait"))
        await until(lambda: _true(gate.entered == 1))
        for _ in range(3):  # at 0.7, 1.4 and 2.1 s: past the first lease, and the next
            await asyncio.sleep(0.7)
            assert await in_flight(storage, 1, lease=1.2) == 1
            assert (await client.get("/")).status_code == 429
        gate.open.set()
        assert (await held).status_code == 200
        await until(lambda: in_flight_is_zero(storage))
        assert (await client.get("/")).status_code == 200


async def in_flight_is_zero(storage: Storage) -> bool:
    return await in_flight(storage, 1, lease=1.2) == 0


async def test_renewing_never_brings_a_slot_back(real_time_storage: Storage) -> None:
    """A lease given back, or one that has ended, stays ended when renewed late."""
    storage = real_time_storage
    hit = Hit(Limit.concurrency(2, lease=0.3))
    first = (await storage.decide(KEY, [hit])).leases
    second = (await storage.decide(KEY, [hit])).leases
    await storage.release(first)
    await storage.renew([*first, *second], hit.limit.period_us)
    assert await in_flight(storage, 2, lease=0.3) == 1  # the given-back one stays back
    await asyncio.sleep(0.2)
    await storage.renew(second, hit.limit.period_us)
    await asyncio.sleep(0.2)  # past its first end: renewed, still held
    assert await in_flight(storage, 2, lease=0.3) == 1
    await asyncio.sleep(0.2)  # past the renewed end
    assert await in_flight(storage, 2, lease=0.3) == 0
    await storage.renew(second, hit.limit.period_us)
    assert await in_flight(storage, 2, lease=0.3) == 0


async def test_a_failing_renewal_is_logged_and_renewing_stops_when_nothing_is_held(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A storage whose renewals fail: logged, and the renewing goes on; once no request
    holds a slot, nothing is renewed any more (until the next request holds one)."""
    class Failing(MemoryStorage):
        renewals = 0

        async def renew(self, leases: Any, period_us: int) -> None:
            Failing.renewals += 1
            raise OSError("the storage went away")

    gate = Gate()
    app = make_app(gate.routes(), tiers=[Tier("t", "1000/minute", concurrency=1)],
                   storage=Failing(), concurrency_lease=0.3)
    async with client_for(app) as client:
        held = asyncio.ensure_future(client.get("/wait"))
        await until(lambda: _true(Failing.renewals >= 2))
        assert ("slot renewal failed: event=slot_renewal_failed "
                "error=OSError: the storage went away") in caplog.text
        gate.open.set()
        assert (await held).status_code == 200
        renewed = Failing.renewals
        await asyncio.sleep(0.35)  # three ticks
        assert Failing.renewals == renewed
        gate.open.clear()
        held = asyncio.ensure_future(client.get("/wait"))
        await until(lambda: _true(Failing.renewals > renewed))
        gate.open.set()
        assert (await held).status_code == 200


@pytest.mark.slow
@pytest.mark.redis
async def test_many_identities_keep_their_slots_past_the_lease(
    redis_url: str, redis_prefix: str,
) -> None:
    """200 callers each hold a slot past its 1.2 s lease: every renewal lands (a burst of
    200 connections at once, each allowed 50 ms to connect, used to time out and lose
    slots), so each caller's second request meanwhile is refused."""
    storage = RedisStorage.from_url(redis_url, prefix=redis_prefix, timeout=2.0,
                                    socket_connect_timeout=0.05)
    gate = Gate()
    app = make_app(gate.routes(), tiers=[Tier("t", "1000/minute", concurrency=1)],
                   storage=storage, key="api_key", concurrency_lease=1.2,
                   storage_timeout=2.0)
    callers = [{"X-API-Key": f"caller-{n}"} for n in range(200)]
    try:
        async with client_for(app) as client:
            held = [asyncio.ensure_future(client.get("/wait", headers=headers))
                    for headers in callers]
            await until(lambda: _true(gate.entered == len(callers)), timeout=10)
            await asyncio.sleep(1.7)  # past the first lease: renewed, or lost
            again = await asyncio.gather(*(client.get("/", headers=headers)
                                           for headers in callers))
            gate.open.set()
            assert [r.status_code for r in await asyncio.gather(*held)] == [200] * 200
        assert [r.status_code for r in again] == [429] * 200
    finally:
        await storage.close()


@pytest.mark.slow
async def test_a_hanging_storage_does_not_hold_up_the_fallback_s_renewals() -> None:
    """failure_mode=memory: request A holds a slot of the storage, whose renewals then
    hang; B, admitted on the memory fallback, keeps its slot past its lease all the
    same (each storage renews on its own, within a tick), so C is refused."""
    from ratelimit_mw import StorageError

    class Hanging(MemoryStorage):
        down = False

        async def decide(self, key: str, hits: Any, **options: Any) -> Any:
            if self.down:
                raise StorageError("the storage went away")
            return await super().decide(key, hits, **options)

        async def renew(self, leases: Any, period_us: int) -> None:
            await asyncio.sleep(3600)

    storage = Hanging()
    gate = Gate()
    app = make_app(gate.routes(), tiers=[Tier("t", "1000/minute", concurrency=1)],
                   storage=storage, failure_mode="memory", concurrency_lease=0.9,
                   storage_timeout=1.0)
    async with client_for(app) as client:
        first = asyncio.ensure_future(client.get("/wait"))
        await until(lambda: _true(gate.entered == 1))
        storage.down = True
        second = asyncio.ensure_future(client.get("/wait"))
        await until(lambda: _true(gate.entered == 2))
        await asyncio.sleep(1.4)  # past the fallback slot's first lease
        assert (await client.get("/")).status_code == 429
        gate.open.set()
        assert [(await first).status_code, (await second).status_code] == [200, 200]


@pytest.mark.slow
def test_slots_held_on_two_event_loops_at_once_are_each_renewed() -> None:
    """One middleware driven from two event loops at the same time (a test client used
    without ``with`` runs each request on a loop of its own): a request on loop B does
    not take over loop A's renewals, so A's slot, held past its lease, still counts."""
    storage = MemoryStorage()
    gate = threading.Event()

    async def wait(request: Request) -> Response:
        await asyncio.to_thread(gate.wait, 10)
        return PlainTextResponse("done")

    app = make_app([Route("/wait", wait), Route("/", lambda request: PlainTextResponse("ok"))],
                   tiers=[Tier("t", "1000/minute", concurrency=2)], storage=storage,
                   concurrency_lease=0.9)
    codes: dict[str, int] = {}

    def on_its_own_loop(name: str, path: str, after: float) -> threading.Thread:
        async def call() -> None:
            await asyncio.sleep(after)
            async with client_for(app) as client:
                codes[name] = (await client.get(path)).status_code

        thread = threading.Thread(target=asyncio.run, args=(call(),))
        thread.start()
        return thread

    first = on_its_own_loop("A", "/wait", 0)
    on_its_own_loop("B", "/", 0.2).join()  # arms renewals on its loop, then ends
    time.sleep(2.0)  # past A's lease, twice
    taken = asyncio.run(in_flight(storage, 2, lease=0.9))
    gate.set()
    first.join()
    assert codes == {"B": 200, "A": 200}
    assert taken == 1

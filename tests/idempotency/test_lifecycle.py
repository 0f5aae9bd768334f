"""How keys are freed: client disconnects, dead workers, failing stores, anonymous callers."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from pydantic import BaseModel
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.responses import JSONResponse
from starlette.routing import Route
from starlette.types import Message, Receive, Scope, Send

from ratelimit_mw.errors import StorageError
from ratelimit_mw.idempotency import (
    Claim,
    IdempotencyMiddleware,
    IdempotencyStore,
    MemoryIdempotencyStore,
    RedisIdempotencyStore,
    StoredResponse,
    fingerprint,
    record_key,
)
from tests.conftest import FakeClock

from .conftest import Harness, uvicorn_serving

KEY = {"Idempotency-Key": "k-1", "X-API-Key": "alice"}
BODY = b'{"item": "book"}'


class Order(BaseModel):
    """A FastAPI request body."""

    item: str


class Hang:
    """A raw ASGI endpoint: the first request waits for the client to leave and never answers."""

    def __init__(self) -> None:
        self.runs = 0
        self.waiting = asyncio.Event()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        self.runs += 1
        await receive()  # the body
        if self.runs == 1:
            self.waiting.set()
            while (await receive())["type"] != "http.disconnect":
                pass
            return
        await JSONResponse({"run": self.runs}, status_code=201)(scope, receive, send)


def hang_app(hang: Hang, store: IdempotencyStore, **options: Any) -> Starlette:
    return Starlette(
        routes=[Route("/hang", hang, methods=["POST"])],
        middleware=[Middleware(IdempotencyMiddleware, store=store, **options)],
    )


def client_for(app: Any) -> httpx.AsyncClient:
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    return httpx.AsyncClient(transport=transport, base_url="http://test")


@pytest.mark.parametrize("transport", ["asgi"])
async def test_disconnect_mid_request_frees_the_key(harness: Harness) -> None:
    """A request whose client leaves before the answer frees its key for the retry."""
    hang = Hang()
    store = harness.make_store()
    app = hang_app(hang, store)
    gone = asyncio.Event()
    sent: list[Message] = []
    script: list[Message] = [{"type": "http.request", "body": BODY, "more_body": False}]

    async def receive() -> Message:
        if script:
            return script.pop(0)
        await gone.wait()
        return {"type": "http.disconnect"}

    async def send(message: Message) -> None:
        sent.append(message)

    scope: Scope = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
        "scheme": "http", "path": "/hang", "raw_path": b"/hang", "root_path": "",
        "query_string": b"", "client": ("127.0.0.1", 5000), "server": ("test", 80),
        "headers": [(b"idempotency-key", b"k-1"), (b"x-api-key", b"alice")],
    }
    try:
        first = asyncio.create_task(app(scope, receive, send))
        await hang.waiting.wait()
        async with client_for(app) as client:
            busy = await client.post("/hang", content=BODY, headers=KEY)
            gone.set()
            await first
            retry = await client.post("/hang", content=BODY, headers=KEY)
    finally:
        await store.close()
    assert sent == []
    assert busy.status_code == 409
    assert retry.status_code == 201
    assert hang.runs == 2


@pytest.mark.parametrize("transport", ["uvicorn"])
async def test_disconnect_frees_the_key_behind_uvicorn(harness: Harness) -> None:
    """Over a real socket: the client times out and hangs up, and its key is freed."""
    hang = Hang()
    store = harness.make_store()
    with uvicorn_serving(hang_app(hang, store), store) as url:
        async with httpx.AsyncClient(base_url=url, timeout=0.2) as client:
            with pytest.raises(httpx.ReadTimeout):
                await client.post("/hang", content=BODY, headers=KEY)
        async with httpx.AsyncClient(base_url=url, timeout=5) as client:
            deadline = time.monotonic() + 5
            while True:
                retry = await client.post("/hang", content=BODY, headers=KEY)
                if retry.status_code != 409 or time.monotonic() > deadline:
                    break
                await asyncio.sleep(0.02)
    assert retry.status_code == 201
    assert hang.runs == 2


@pytest.mark.parametrize("transport", ["asgi"])
async def test_cancelled_request_frees_the_key(harness: Harness) -> None:
    """A request cancelled mid-handler (server shutdown, client gone) frees its key."""
    hang = Hang()
    store = harness.make_store()
    app = hang_app(hang, store)
    try:
        async with client_for(app) as client:
            first = asyncio.create_task(client.post("/hang", content=BODY, headers=KEY))
            await hang.waiting.wait()
            first.cancel()
            with pytest.raises(asyncio.CancelledError):
                await first
            retry = await client.post("/hang", content=BODY, headers=KEY)
    finally:
        await store.close()
    assert retry.status_code == 201


@pytest.mark.parametrize("transport", ["asgi"])
async def test_dead_workers_lease_expires(harness: Harness, clock: FakeClock) -> None:
    """A key held by a worker that died is 409 until its lease runs out, then runs."""
    store = harness.make_store()
    record = record_key("api-key:alice", "k-1")
    await store.claim(record, fingerprint("POST", "/hang", b"", BODY), lock_ttl=30)
    hang = Hang()
    hang.runs = 1  # answer at once
    try:
        async with client_for(hang_app(hang, store, lock_ttl=30)) as client:
            busy = await client.post("/hang", content=BODY, headers=KEY)
            if isinstance(store, RedisIdempotencyStore):
                await store._client.pexpire(store.prefix + record, 1)
                await asyncio.sleep(0.01)
            else:
                clock.advance(30)
            freed = await client.post("/hang", content=BODY, headers=KEY)
    finally:
        await store.close()
    assert busy.status_code == 409
    assert freed.status_code == 201


class BrokenStore(IdempotencyStore):
    """A store whose backend is down."""

    async def claim(self, key: str, fingerprint: str, *, lock_ttl: float) -> Claim:
        raise StorageError("connection refused")

    async def complete(
        self, key: str, token: str, fingerprint: str, response: StoredResponse, *, ttl: float
    ) -> bool:
        raise StorageError("connection refused")

    async def release(self, key: str, token: str) -> None:
        raise StorageError("connection refused")


async def test_store_down_answers_503_by_default() -> None:
    """When the store fails, a keyed request is refused with 503, not run unprotected."""
    hang = Hang()
    hang.runs = 1
    async with client_for(hang_app(hang, BrokenStore())) as client:
        response = await client.post("/hang", content=BODY, headers=KEY)
    assert response.status_code == 503
    assert response.headers["retry-after"] == "1"
    assert response.json()["error"] == "idempotency_unavailable"
    assert hang.runs == 1


async def test_store_down_with_fail_open_runs_the_request() -> None:
    """With fail_open=True the request runs without idempotency, body intact."""
    hang = Hang()
    hang.runs = 1
    async with client_for(hang_app(hang, BrokenStore(), fail_open=True)) as client:
        response = await client.post("/hang", content=BODY, headers=KEY)
    assert response.status_code == 201
    assert hang.runs == 2


class FlakyStore(MemoryIdempotencyStore):
    """Claims work; storing the response fails."""

    async def complete(
        self, key: str, token: str, fingerprint: str, response: StoredResponse, *, ttl: float
    ) -> bool:
        raise StorageError("connection reset")


async def test_failed_completion_still_answers_and_frees_the_key() -> None:
    """If the response cannot be stored, the client still gets it and the key is freed."""
    hang = Hang()
    hang.runs = 1
    async with client_for(hang_app(hang, FlakyStore())) as client:
        first = await client.post("/hang", content=BODY, headers=KEY)
        second = await client.post("/hang", content=BODY, headers=KEY)
    assert first.status_code == second.status_code == 201
    assert hang.runs == 3


@pytest.mark.parametrize("sync", [True, False])
async def test_identity_none_turns_idempotency_off(sync: bool) -> None:
    """An identity function returning None lets the request through without a key check."""

    def anonymous(scope: Scope) -> None:
        return None

    async def async_anonymous(scope: Scope) -> None:
        return None

    hang = Hang()
    hang.runs = 1
    identity = anonymous if sync else async_anonymous
    async with client_for(hang_app(hang, MemoryIdempotencyStore(), identity=identity)) as client:
        for _ in range(2):
            assert (await client.post("/hang", content=BODY, headers=KEY)).status_code == 201
    assert hang.runs == 3


async def test_custom_async_identity_scopes_keys() -> None:
    """An async identity function decides who shares keys."""

    async def tenant(scope: Scope) -> str:
        return str(dict(scope["headers"]).get(b"x-tenant", b"").decode())

    hang = Hang()
    hang.runs = 1
    app = hang_app(hang, MemoryIdempotencyStore(), identity=tenant)
    async with client_for(app) as client:
        a = await client.post("/hang", content=BODY, headers={**KEY, "X-Tenant": "a"})
        a_again = await client.post("/hang", content=BODY, headers={**KEY, "X-Tenant": "a"})
        b = await client.post("/hang", content=BODY, headers={**KEY, "X-Tenant": "b"})
    assert a_again.headers["x-idempotent-replayed"] == "true"
    assert "x-idempotent-replayed" not in b.headers
    assert a.json() != b.json()


async def test_fastapi_app_with_a_parsed_body() -> None:
    """Behind FastAPI the buffered body still parses, and the replay matches."""
    runs = 0
    api = FastAPI()

    @api.post("/orders", status_code=201)
    async def create(order: Order) -> dict[str, object]:
        nonlocal runs
        runs += 1
        return {"item": order.item, "run": runs}

    app = IdempotencyMiddleware(api, store=MemoryIdempotencyStore())
    async with client_for(app) as client:
        first = await client.post("/orders", json={"item": "book"}, headers=KEY)
        second = await client.post("/orders", json={"item": "book"}, headers=KEY)
        invalid = await client.post("/orders", json={"nope": 1}, headers={**KEY, "X-API-Key": "b"})
    assert first.status_code == 201
    assert second.json() == first.json() == {"item": "book", "run": 1}
    assert second.headers["x-idempotent-replayed"] == "true"
    assert invalid.status_code == 422  # FastAPI's own validation answer, stored like any 4xx

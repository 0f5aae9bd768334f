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
from ratelimit_mw.identity import credentials
from tests.conftest import FakeClock

from .conftest import Harness, Orders, uvicorn_serving

KEY = {"Idempotency-Key": "k-1", "X-API-Key": "alice"}
BODY = b'{"item": "book"}'
# Where KEY's requests keep their record: their caller is known by the API key sent.
RECORD = record_key(str(credentials({"headers": [(b"x-api-key", b"alice")]}, b"x-api-key")),
                    "k-1")


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


async def run_out(store: IdempotencyStore, clock: FakeClock, lock_ttl: float) -> None:
    """Let the lease on KEY (held for ``lock_ttl`` s) run out: move the clock, or cut the TTL."""
    if not isinstance(store, RedisIdempotencyStore):
        clock.advance(lock_ttl)
        return
    lease = store.prefix + RECORD
    assert 0 < await store._client.pttl(lease) <= lock_ttl * 1000
    await store._client.pexpire(lease, 1)
    await asyncio.sleep(0.01)


@pytest.mark.parametrize("transport", ["asgi"])
async def test_dead_workers_lease_expires(harness: Harness, clock: FakeClock) -> None:
    """A key held by a worker that died is 409 until its lease runs out, then runs."""
    store = harness.make_store()
    await store.claim(RECORD, fingerprint("POST", "/hang", b"", BODY), lock_ttl=30)
    hang = Hang()
    hang.runs = 1  # answer at once
    try:
        async with client_for(hang_app(hang, store, lock_ttl=30)) as client:
            busy = await client.post("/hang", content=BODY, headers=KEY)
            await run_out(store, clock, 30)
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

    async def renew(self, key: str, token: str, *, lock_ttl: float) -> bool:
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


async def test_a_memory_store_full_of_running_requests_answers_503() -> None:
    """A full memory store refuses a new key rather than evict a running request's lease."""
    orders = Orders()
    orders.gate.clear()
    async with client_for(orders.app(MemoryIdempotencyStore(max_entries=1))) as client:
        first = asyncio.create_task(
            client.post("/orders", content=BODY, headers={**KEY, "Idempotency-Key": "a"}))
        while not orders.runs["create"]:
            await asyncio.sleep(0.005)
        # Bounded: a request that got a key runs, and waits on the gate.
        other, busy = [
            await asyncio.wait_for(client.post("/orders", content=BODY, headers={
                **KEY, "Idempotency-Key": key}), 5)
            for key in ("b", "a")]
        orders.gate.set()
        done = await first
    assert other.status_code == 503
    assert other.json()["error"] == "idempotency_unavailable"
    assert busy.status_code == 409
    assert done.status_code == 201
    assert orders.runs["create"] == 1


class FailingCompletions(IdempotencyStore):
    """A real store whose first ``failures`` attempts to store a response fail."""

    def __init__(self, store: IdempotencyStore, failures: int) -> None:
        self.store = store
        self.failures = failures
        self.attempts = 0

    async def claim(self, key: str, fingerprint: str, *, lock_ttl: float) -> Claim:
        return await self.store.claim(key, fingerprint, lock_ttl=lock_ttl)

    async def complete(
        self, key: str, token: str, fingerprint: str, response: StoredResponse, *, ttl: float
    ) -> bool:
        self.attempts += 1
        if self.attempts <= self.failures:
            raise StorageError("connection reset")
        return await self.store.complete(key, token, fingerprint, response, ttl=ttl)

    async def renew(self, key: str, token: str, *, lock_ttl: float) -> bool:
        return await self.store.renew(key, token, lock_ttl=lock_ttl)

    async def release(self, key: str, token: str) -> None:
        await self.store.release(key, token)

    async def close(self) -> None:
        await self.store.close()


@pytest.mark.parametrize("transport", ["asgi"])
async def test_a_failed_attempt_to_store_the_response_is_retried(harness: Harness) -> None:
    """A store that fails once while keeping the response gets it on the next try: replayed."""
    hang = Hang()
    hang.runs = 1
    store = FailingCompletions(harness.make_store(), failures=1)
    try:
        async with client_for(hang_app(hang, store)) as client:
            first = await client.post("/hang", content=BODY, headers=KEY)
            second = await client.post("/hang", content=BODY, headers=KEY)
    finally:
        await store.close()
    assert first.status_code == second.status_code == 201
    assert second.headers["x-idempotent-replayed"] == "true"
    assert hang.runs == 2


@pytest.mark.parametrize("transport", ["asgi"])
async def test_a_response_that_cannot_be_stored_keeps_the_key_locked(
    harness: Harness, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    """The work was done: the client gets its answer, a retry gets 409 (not a second run)
    until the lease runs out, and the failure is logged as an error."""
    hang = Hang()
    hang.runs = 1
    store = FailingCompletions(harness.make_store(), failures=100)
    try:
        async with client_for(hang_app(hang, store, lock_ttl=30)) as client:
            first = await client.post("/hang", content=BODY, headers=KEY)
            retry = await client.post("/hang", content=BODY, headers=KEY)
            await run_out(store.store, clock, 30)
            later = await client.post("/hang", content=BODY, headers=KEY)
    finally:
        await store.close()
    assert first.status_code == 201
    assert retry.status_code == 409
    assert later.status_code == 201
    assert hang.runs == 3
    errors = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert len(errors) == 2 and all("stays locked" in error for error in errors)  # one a run


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

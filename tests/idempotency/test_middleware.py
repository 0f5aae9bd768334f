"""IdempotencyMiddleware end to end: memory and Redis, in-process and behind uvicorn."""

from __future__ import annotations

import asyncio
import json
import time

import httpx
import pytest
import redis.asyncio as aioredis
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .conftest import Harness

KEY = {"Idempotency-Key": "8e03978e-40d5-43e8-bc93-6894a57f9324"}
ORDER = {"item": "book", "quantity": 1}


def keyed(key: str | bytes, **headers: str) -> dict[bytes, bytes]:
    """Headers carrying ``key`` as its exact bytes (str keys are sent as latin-1)."""
    raw = key if isinstance(key, bytes) else key.encode("latin-1")
    return {b"Idempotency-Key": raw, **{k.encode(): v.encode() for k, v in headers.items()}}


def same_answer(first: httpx.Response, second: httpx.Response) -> bool:
    return (first.status_code, first.content, first.headers.get("x-order")) == (
        second.status_code,
        second.content,
        second.headers.get("x-order"),
    )


async def test_replay_returns_the_stored_response(harness: Harness) -> None:
    """The same request again gets the first response, marked as replayed; the handler runs once."""
    async with harness.client() as client:
        first = await client.post("/orders", json=ORDER, headers=KEY)
        second = await client.post("/orders", json=ORDER, headers=KEY)
    assert first.status_code == 201
    assert "x-idempotent-replayed" not in first.headers
    assert second.headers["x-idempotent-replayed"] == "true"
    assert same_answer(first, second)
    assert second.headers["content-type"] == "application/json"
    assert harness.orders.runs["create"] == 1


async def test_every_keyed_answer_echoes_the_key(harness: Harness) -> None:
    """The first answer, its replay, a 409 and a 422 carry the client's key back, as sent;
    the stored response does not keep it (a replay to a quoted key echoes the quoted form)."""
    quoted = {"Idempotency-Key": f'"{KEY["Idempotency-Key"]}"'}
    async with harness.client() as client:
        first = await client.post("/orders", json=ORDER, headers=KEY)
        replay = await client.post("/orders", json=ORDER, headers=quoted)
        reused = await client.post("/orders", json={"item": "pen"}, headers=KEY)
        harness.orders.gate.clear()
        running = asyncio.create_task(client.post("/orders", json=ORDER, headers={
            "Idempotency-Key": "second"}))
        await asyncio.sleep(0.2)
        in_flight = await client.post("/orders", json=ORDER, headers={"Idempotency-Key": "second"})
        harness.orders.gate.set()
        await running
        unkeyed = await client.post("/orders", json=ORDER)
    assert first.headers.get_list("idempotency-key") == [KEY["Idempotency-Key"]]
    assert replay.headers["x-idempotent-replayed"] == "true"
    assert replay.headers.get_list("idempotency-key") == [quoted["Idempotency-Key"]]
    assert (reused.status_code, reused.headers["idempotency-key"]) == (
        422, KEY["Idempotency-Key"])
    assert (in_flight.status_code, in_flight.headers["idempotency-key"]) == (409, "second")
    assert "idempotency-key" not in unkeyed.headers


async def test_concurrent_requests_run_the_handler_once(harness: Harness) -> None:
    """Twenty identical requests at once: one runs, the others get 409 while it does."""
    harness.orders.gate.clear()
    async with harness.client() as client:
        tasks = [
            asyncio.create_task(client.post("/orders", json=ORDER, headers=KEY)) for _ in range(20)
        ]
        deadline = time.monotonic() + 10
        while sum(task.done() for task in tasks) < 19 and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        early = [task.result() for task in tasks if task.done()]
        harness.orders.gate.set()
        responses = await asyncio.gather(*tasks)
        replay = await client.post("/orders", json=ORDER, headers=KEY)
    assert len(early) == 19
    assert all(r.status_code == 409 for r in early)
    assert all(r.headers["retry-after"] == "1" for r in early)
    assert sorted(r.status_code for r in responses) == [201] + [409] * 19
    assert replay.headers["x-idempotent-replayed"] == "true"
    assert harness.orders.runs["create"] == 1


async def test_different_request_with_the_same_key_is_422(harness: Harness) -> None:
    """Reusing a key for another body, path or query is refused without running the handler."""
    async with harness.client() as client:
        await client.post("/orders", json=ORDER, headers=KEY)
        other_body = await client.post("/orders", json={"item": "pen"}, headers=KEY)
        other_query = await client.post("/orders?x=1", json=ORDER, headers=KEY)
        other_method = await client.patch("/orders", json=ORDER, headers=KEY)
        again = await client.post("/orders", json=ORDER, headers=KEY)
    assert other_body.status_code == other_query.status_code == other_method.status_code == 422
    assert other_body.json()["error"] == "idempotency_key_reused"
    assert again.headers["x-idempotent-replayed"] == "true"
    assert harness.orders.runs["create"] == 1


@pytest.mark.parametrize("failure", ["status 500", "status 503", "exception"])
async def test_server_errors_are_not_stored(harness: Harness, failure: str) -> None:
    """A handler that answers 5xx or raises stores nothing: the next attempt runs."""
    if failure == "exception":
        harness.orders.raise_next = True
    else:
        harness.orders.fail_status = int(failure.split()[1])
    async with harness.client() as client:
        # uvicorn drops the connection of a request whose app raised: don't reuse it.
        first = await client.post("/orders", json=ORDER, headers={**KEY, "Connection": "close"})
        second = await client.post("/orders", json=ORDER, headers=KEY)
        third = await client.post("/orders", json=ORDER, headers=KEY)
    assert first.status_code >= 500
    assert second.status_code == 201
    assert "x-idempotent-replayed" not in second.headers
    assert third.headers["x-idempotent-replayed"] == "true"
    assert harness.orders.runs["create"] == 2


@pytest.mark.parametrize("status", [408, 425, 429])
async def test_try_again_later_answers_are_not_stored(harness: Harness, status: int) -> None:
    """A 408, 425 or 429 asks for a retry: it is not stored, and the retry runs."""
    harness.orders.fail_status = status
    async with harness.client() as client:
        first = await client.post("/orders", json=ORDER, headers=KEY)
        second = await client.post("/orders", json=ORDER, headers=KEY)
    assert first.status_code == status
    assert second.status_code == 201
    assert "x-idempotent-replayed" not in second.headers
    assert harness.orders.runs["create"] == 2


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["redis"])
async def test_a_handler_slower_than_the_lock_ttl_keeps_its_key(harness: Harness) -> None:
    """The lease is renewed while the handler runs: a retry after lock_ttl is still 409."""
    harness.orders.gate.clear()
    async with harness.client(lock_ttl=0.6) as client:
        first = asyncio.create_task(client.post("/orders", json=ORDER, headers=KEY))
        while not harness.orders.runs["create"]:
            await asyncio.sleep(0.005)
        await asyncio.sleep(1.2)  # twice the lock_ttl
        # Bounded: a retry that got the key would run, and wait on the gate.
        busy = await asyncio.wait_for(client.post("/orders", json=ORDER, headers=KEY), 5)
        harness.orders.gate.set()
        done = await first
        replay = await client.post("/orders", json=ORDER, headers=KEY)
    assert busy.status_code == 409
    assert done.status_code == 201
    assert replay.headers["x-idempotent-replayed"] == "true"
    assert harness.orders.runs["create"] == 1


async def test_client_errors_are_stored(harness: Harness) -> None:
    """A 4xx from the handler is a real answer and is replayed like any other."""
    harness.orders.fail_status = 402
    async with harness.client() as client:
        first = await client.post("/orders", json=ORDER, headers=KEY)
        second = await client.post("/orders", json=ORDER, headers=KEY)
    assert first.status_code == second.status_code == 402
    assert second.headers["x-idempotent-replayed"] == "true"
    assert harness.orders.runs["create"] == 1


async def test_callers_do_not_share_keys(harness: Harness) -> None:
    """Two callers using the same key each get their own run and their own replay."""
    alice, bob = keyed("shared-key", **{"X-API-Key": "alice"}), keyed("shared-key", **{
        "X-API-Key": "bob"})
    async with harness.client() as client:
        a1 = await client.post("/orders", json=ORDER, headers=alice)
        b1 = await client.post("/orders", json=ORDER, headers=bob)
        a2 = await client.post("/orders", json=ORDER, headers=alice)
        b2 = await client.post("/orders", json=ORDER, headers=bob)
    assert (a1.headers["x-order"], b1.headers["x-order"]) == ("1", "2")
    assert same_answer(a1, a2)
    assert same_answer(b1, b2)
    assert harness.orders.runs["create"] == 2


@pytest.mark.parametrize("method", ["GET", "HEAD"])
async def test_safe_methods_with_a_key_pass_through(harness: Harness, method: str) -> None:
    """GET and HEAD ignore the key: every request runs."""
    async with harness.client() as client:
        for _ in range(3):
            response = await client.request(method, "/orders", headers=KEY)
            assert "x-idempotent-replayed" not in response.headers
    assert harness.orders.runs["count"] == 3


async def test_post_without_a_key_is_not_idempotent(harness: Harness) -> None:
    """Without a key, on a route that does not require one, every POST runs."""
    async with harness.client() as client:
        for _ in range(2):
            assert (await client.post("/orders", json=ORDER)).status_code == 201
    assert harness.orders.runs["create"] == 2


async def test_required_key_missing_is_400(harness: Harness) -> None:
    """A route that requires a key answers 400 without one, and works with one."""
    async with harness.client() as client:
        missing = await client.post("/payments", json=ORDER)
        given = await client.post("/payments", json=ORDER, headers=KEY)
    assert missing.status_code == 400
    assert missing.json()["error"] == "idempotency_key_missing"
    assert missing.headers["cache-control"] == "no-store"
    assert given.status_code == 201
    assert harness.orders.runs["create"] == 1


@pytest.mark.parametrize(
    "key",
    ["", '""', "k" * 256, '"' + "k" * 256 + '"', '"unclosed', '"a"b', '"bad\\escape"'],
    ids=["empty", "empty-quoted", "256", "256-quoted", "unclosed", "trailing", "escape"],
)
async def test_unusable_keys_are_400(harness: Harness, key: str) -> None:
    """Empty, over 255 characters or malformed keys are refused before the handler."""
    async with harness.client() as client:
        response = await client.post("/orders", json=ORDER, headers=keyed(key))
    assert response.status_code == 400
    assert response.json()["error"] == "idempotency_key_invalid"
    assert harness.orders.runs["create"] == 0


@pytest.mark.parametrize("transport", ["asgi"])  # h11 won't send outer spaces
async def test_blank_key_is_400(harness: Harness) -> None:
    """A key of only spaces is empty once trimmed."""
    async with harness.client() as client:
        response = await client.post("/orders", json=ORDER, headers=keyed("   "))
    assert response.status_code == 400


async def test_255_characters_and_quoted_form(harness: Harness) -> None:
    """A 255-character key works, and its quoted sf-string form is the same key."""
    key = "k" * 255
    async with harness.client() as client:
        plain = await client.post("/orders", json=ORDER, headers=keyed(key))
        quoted = await client.post("/orders", json=ORDER, headers=keyed(f'"{key}"'))
    assert plain.status_code == 201
    assert quoted.headers["x-idempotent-replayed"] == "true"


@pytest.mark.parametrize(
    "key",
    [
        b"k" * 10_000,
        "caf\u00e9-\u00fcber".encode("latin-1"),
        "\u20ac".encode(),
        b"{user}:1",
        b'"{a}:{b}\\"c\\\\"',
        b"} {",
        b"*",
        b"key\twith\ttabs",
    ],
    ids=["10kB", "latin-1", "utf-8", "braces", "quoted-braces", "brace-pair", "star", "tabs"],
)
async def test_hostile_keys_never_cause_a_server_error(harness: Harness, key: bytes) -> None:
    """Huge, non-ASCII or brace-laden keys get a clean 400 or work; never a 5xx."""
    async with harness.client() as client:
        first = await client.post("/orders", json=ORDER, headers=keyed(key))
        second = await client.post("/orders", json=ORDER, headers=keyed(key))
    assert first.status_code in (201, 400)
    if first.status_code == 201:
        assert second.headers["x-idempotent-replayed"] == "true"
    else:
        assert second.status_code == 400


async def test_streaming_response_is_not_stored(harness: Harness) -> None:
    """A response in several chunks passes through and frees the key."""
    async with harness.client() as client:
        first = await client.post("/stream", headers=KEY)
        second = await client.post("/stream", headers=KEY)
    assert first.content == second.content == b"one,two"
    assert "x-idempotent-replayed" not in second.headers
    assert harness.orders.runs["stream"] == 2


async def test_response_over_the_size_limit_is_not_stored(harness: Harness) -> None:
    """A body over max_response_size passes through unstored and frees the key."""
    async with harness.client(max_response_size=1000) as client:
        first = await client.post("/large", headers=KEY)
        second = await client.post("/large", headers=KEY)
    assert len(first.content) == len(second.content) == 2000
    assert harness.orders.runs["large"] == 2


async def test_request_over_the_size_limit_is_413(harness: Harness) -> None:
    """A keyed request whose body is over max_request_size is refused, not run unprotected."""
    async with harness.client(max_request_size=64) as client:
        big = await client.post("/orders", content=b"x" * 65, headers=KEY)
        fits = await client.post("/orders", content=b"x" * 64, headers=KEY)

        async def chunked() -> object:
            yield b"x" * 40
            yield b"x" * 40

        streamed = await client.post(
            "/orders", content=chunked(), headers=keyed("other")  # type: ignore[arg-type]
        )
    assert big.status_code == 413
    assert big.json()["error"] == "request_too_large"
    assert streamed.status_code == 413
    assert fits.status_code == 201
    assert harness.orders.runs["create"] == 1


async def test_body_reaches_the_handler_unchanged(harness: Harness) -> None:
    """The buffered body is handed to the app byte for byte."""
    payload = bytes(range(256)) * 40
    async with harness.client() as client:
        response = await client.post("/orders", content=payload, headers=KEY)
    assert response.json()["echo"].encode("latin-1") == payload


async def test_patch_is_idempotent_too(harness: Harness) -> None:
    """PATCH with a key is replayed like POST."""
    async with harness.client() as client:
        first = await client.patch("/orders", json=ORDER, headers=KEY)
        second = await client.patch("/orders", json=ORDER, headers=KEY)
    assert same_answer(first, second)
    assert second.headers["x-idempotent-replayed"] == "true"


@pytest.mark.parametrize("backend", ["memory"])  # Redis keeps time itself: see below
async def test_expires_after_the_ttl_on_a_fake_clock(harness: Harness) -> None:
    """After 24 h the key is forgotten and the request runs again (memory store, fake clock)."""
    async with harness.client() as client:
        await client.post("/orders", json=ORDER, headers=KEY)
        harness.clock.advance(24 * 3600 - 1)
        kept = await client.post("/orders", json=ORDER, headers=KEY)
        harness.clock.advance(1)
        again = await client.post("/orders", json=ORDER, headers=KEY)
    assert kept.headers["x-idempotent-replayed"] == "true"
    assert "x-idempotent-replayed" not in again.headers
    assert harness.orders.runs["create"] == 2


@pytest.mark.parametrize("backend", ["redis"])
async def test_redis_records_expire(harness: Harness, redis_url: str) -> None:
    """Redis records carry the 24 h TTL, and once Redis expires them the request runs again."""
    async with harness.client() as client:
        await client.post("/orders", json=ORDER, headers=KEY)
        probe = aioredis.Redis.from_url(redis_url)
        try:
            names = [n async for n in probe.scan_iter(match=harness.redis_prefix + "*")]
            assert len(names) == 1
            assert 24 * 3600 * 1000 - 5000 < await probe.pttl(names[0]) <= 24 * 3600 * 1000
            await probe.pexpire(names[0], 1)
            await asyncio.sleep(0.01)
        finally:
            await probe.aclose()
        again = await client.post("/orders", json=ORDER, headers=KEY)
    assert "x-idempotent-replayed" not in again.headers
    assert harness.orders.runs["create"] == 2


async def test_stored_headers_are_replayed(harness: Harness) -> None:
    """Every header the app sent comes back on the replay."""
    async with harness.client() as client:
        first = await client.post("/orders", json=ORDER, headers=KEY)
        second = await client.post("/orders", json=ORDER, headers=KEY)
    for name in ("content-type", "content-length", "x-order"):
        assert first.headers[name] == second.headers[name]
    assert json.loads(second.content) == json.loads(first.content)


class Stamp:
    """An outer middleware that adds a per-request header to the start message it passes
    on, changing that message as ASGI middleware commonly does."""

    def __init__(self, app: ASGIApp, *, in_place: bool) -> None:
        self.app = app
        self.in_place = in_place
        self.requests = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        self.requests += 1
        stamp = (b"x-request-id", str(self.requests).encode())

        async def stamped(message: Message) -> None:
            if message["type"] == "http.response.start":
                if self.in_place:
                    message["headers"].append(stamp)
                else:
                    message["headers"] = [*message.get("headers", ()), stamp]
            await send(message)

        await self.app(scope, receive, stamped)


@pytest.mark.parametrize("transport", ["asgi"])
@pytest.mark.parametrize("in_place", [False, True], ids=["new-list", "in-place"])
async def test_outer_middleware_headers_are_not_stored(harness: Harness, in_place: bool) -> None:
    """The stored headers are the app's, as it sent them: what a middleware outside adds
    to the message afterwards is not replayed beside what it adds to the replay."""
    store = harness.make_store()
    app = Stamp(harness.orders.app(store), in_place=in_place)
    transport = httpx.ASGITransport(app=app)
    try:
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            first = await client.post("/orders", json=ORDER, headers=KEY)
            second = await client.post("/orders", json=ORDER, headers=KEY)
    finally:
        await store.close()
    assert first.headers.get_list("x-request-id") == ["1"]
    assert second.headers["x-idempotent-replayed"] == "true"
    assert second.headers.get_list("x-request-id") == ["2"]

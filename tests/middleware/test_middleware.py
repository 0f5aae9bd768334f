"""The middleware end to end on memory storage: admission, 429s, caching, shadow, hooks."""

from __future__ import annotations

import asyncio
import json
import logging
import math
from collections.abc import Sequence
from typing import Any

import pytest
from fastapi import FastAPI
from starlette.applications import Starlette
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route, WebSocketRoute
from starlette.types import Receive, Scope, Send
from starlette.websockets import WebSocket

from ratelimit_mw import Hit, Limit, MemoryStorage, Storage
from ratelimit_mw.decision import Lease, Verdict
from ratelimit_mw.events import DecisionEvent
from ratelimit_mw.middleware import RateLimitMiddleware
from ratelimit_mw.rates import Rate
from ratelimit_mw.responses import Denial
from ratelimit_mw.tiers import Tier
from tests.conftest import FakeClock

from .conftest import client_for, make_app, ok


class Counting(Storage):
    """A storage of one's own that wraps a memory one and counts the calls reaching it."""

    def __init__(self, inner: MemoryStorage) -> None:
        self.inner = inner
        self.calls = 0

    async def decide(self, key: str, hits: Sequence[Hit], *, usage: int = 0) -> Verdict:
        self.calls += 1
        return await self.inner.decide(key, hits, usage=usage)

    async def release(self, leases: Sequence[Lease]) -> None:
        await self.inner.release(leases)

    async def usage(self, key: str, granularity: Any, start: float, end: float,
                    ) -> list[tuple[int, int]]:
        return await self.inner.usage(key, granularity, start, end)

    async def reset(self, key: str) -> None:
        await self.inner.reset(key)


async def test_allows_up_to_the_limit_then_429(clock: FakeClock, memory: MemoryStorage) -> None:
    """Three of 3/minute pass; the fourth gets a 429."""
    app = make_app(tiers=[Tier("t", "3/minute")], storage=memory, clock=clock)
    async with client_for(app) as client:
        codes = [(await client.get("/")).status_code for _ in range(4)]
    assert codes == [200, 200, 200, 429]


async def test_429_body_and_cache_control(clock: FakeClock, memory: MemoryStorage) -> None:
    """The 429 carries the JSON body of the reference and Cache-Control: no-store."""
    app = make_app(tiers=[Tier("t", [Limit("2/minute", "fixed_window")])],
                   storage=memory, clock=clock)
    async with client_for(app) as client:
        await client.get("/")
        await client.get("/")
        denied = await client.get("/")
    assert denied.status_code == 429
    assert denied.headers["cache-control"] == "no-store"
    assert denied.headers["content-type"] == "application/json"
    assert denied.headers["retry-after"] == "40"
    assert denied.json() == {
        "error": "rate_limit_exceeded",
        "message": "Too many requests. You have exceeded 2 requests per minute.",
        "retry_after_seconds": 40,
        "limit": 2,
        "window": "60s",
        "reset_at": "2023-11-14T22:14:00Z",
    }


async def test_a_burst_is_named_beside_the_rate(clock: FakeClock, memory: MemoryStorage) -> None:
    """A token bucket whose burst is not its rate: the body's limit is the burst, and
    its message names both, so the two numbers agree."""
    app = make_app(tiers=[Tier("t", [Limit("2/minute", "token_bucket", burst=3)])],
                   storage=memory, clock=clock)
    async with client_for(app) as client:
        for _ in range(3):
            await client.get("/")
        body = (await client.get("/")).json()
    assert body["limit"] == 3
    assert body["message"] == ("Too many requests. You have exceeded 2 requests per minute "
                               "(bursts of up to 3).")


async def test_problem_json_option(clock: FakeClock, memory: MemoryStorage) -> None:
    """response_format='problem+json' answers with an RFC 9457 problem naming the policy."""
    app = make_app(tiers=[Tier("t", [Limit("1/minute", name="per-minute")])],
                   storage=memory, clock=clock, response_format="problem+json")
    async with client_for(app) as client:
        await client.get("/")
        denied = await client.get("/")
    assert denied.headers["content-type"] == "application/problem+json"
    body = denied.json()
    assert body["type"].endswith("#quota-exceeded")
    assert body["status"] == 429
    assert body["violated-policies"] == ["per-minute"]


async def test_custom_denied_response_hook(clock: FakeClock, memory: MemoryStorage) -> None:
    """on_denied builds the 429; rate-limit headers and Retry-After are still added."""
    seen: list[Denial] = []

    async def on_denied(scope: Scope, denial: Denial) -> Response:
        seen.append(denial)
        return JSONResponse({"slow": "down"}, status_code=429)

    app = make_app(tiers=[Tier("t", "1/minute")], storage=memory, clock=clock,
                   on_denied=on_denied)
    async with client_for(app) as client:
        await client.get("/")
        denied = await client.get("/")
    assert denied.json() == {"slow": "down"}
    assert denied.headers["retry-after"].isdigit()
    assert denied.headers["x-ratelimit-remaining"] == "0"
    assert seen[0].tier == "t"
    assert seen[0].key == "ip:203.0.113.7"
    assert denied.headers["cache-control"] == "no-store"


async def test_a_custom_denied_response_keeps_the_headers_it_sets(
    clock: FakeClock, memory: MemoryStorage,
) -> None:
    """What the hook's response sets itself wins: one Retry-After, its own caching
    header; the middleware adds only the headers it lacks."""
    def on_denied(scope: Scope, denial: Denial) -> Response:
        return PlainTextResponse("later", status_code=429, headers={
            "Retry-After": "999", "X-RateLimit-Remaining": "none", "Cache-Control": "private"})

    app = make_app(tiers=[Tier("t", "1/minute")], storage=memory, clock=clock,
                   on_denied=on_denied)
    async with client_for(app) as client:
        await client.get("/")
        denied = await client.get("/")
    assert denied.status_code == 429
    assert denied.headers.get_list("retry-after") == ["999"]
    assert denied.headers.get_list("x-ratelimit-remaining") == ["none"]
    assert denied.headers.get_list("cache-control") == ["private"]
    assert denied.headers["x-ratelimit-limit"] == "1"


async def test_waiting_exactly_retry_after_gets_through(
    clock: FakeClock, memory: MemoryStorage,
) -> None:
    """A client that waits exactly Retry-After seconds is admitted, for every algorithm."""
    for algorithm in ("fixed_window", "sliding_window", "sliding_log", "token_bucket", "gcra"):
        tier = Tier("t", [Limit("3/10 seconds", algorithm)])
        app = make_app(tiers=[tier], storage=memory, clock=clock)
        async with client_for(app) as client:
            while (response := await client.get("/")).status_code == 200:
                clock.advance(0.3)
            wait = int(response.headers["retry-after"])
            clock.advance(wait)
            assert (await client.get("/")).status_code == 200, algorithm
        memory.clear()


async def test_denied_requests_consume_nothing(clock: FakeClock, memory: MemoryStorage) -> None:
    """Denials by one limit leave the other limits' counters untouched."""
    tier = Tier("t", [Limit("2/second", "fixed_window", name="second"),
                      Limit("10/hour", "fixed_window", name="hour")],)
    app = make_app(tiers=[tier], storage=memory, clock=clock, header_style="draft-11")
    async with client_for(app) as client:
        await client.get("/")
        await client.get("/")
        for _ in range(20):
            assert (await client.get("/")).status_code == 429
        clock.advance(1)
        response = await client.get("/")
    assert response.status_code == 200
    assert '"hour";r=7;' in response.headers["ratelimit"]


async def test_blocked_key_answered_without_storage(
    clock: FakeClock, memory: MemoryStorage,
) -> None:
    """A key already over its limit is refused from the local cache until its retry time."""
    storage = Counting(memory)
    app = make_app(tiers=[Tier("t", [Limit("1/minute", "fixed_window")])],
                   storage=storage, clock=clock)
    async with client_for(app) as client:
        await client.get("/")
        first = await client.get("/")
        assert storage.calls == 2
        clock.advance(10)
        cached = [await client.get("/") for _ in range(5)]
        assert storage.calls == 2
        assert all(r.status_code == 429 for r in cached)
        assert cached[0].headers["retry-after"] == str(int(first.headers["retry-after"]) - 10)
        clock.advance(30)
        assert (await client.get("/")).status_code == 200
    assert storage.calls == 3


async def test_a_blocked_keys_denials_each_reach_the_hook(
    clock: FakeClock, memory: MemoryStorage,
) -> None:
    """With ``on_denied``, a key answered from the cache of blocked keys still gets the
    hook's response every time, with the denial's wait counting down."""
    storage = Counting(memory)
    seen: list[Denial] = []

    def on_denied(scope: Scope, denial: Denial) -> Response:
        seen.append(denial)
        return PlainTextResponse(f"wait {math.ceil(denial.retry_after)}", status_code=429)

    app = make_app(tiers=[Tier("t", [Limit("1/minute", "fixed_window")])], storage=storage,
                   clock=clock, on_denied=on_denied)
    async with client_for(app) as client:
        await client.get("/")
        texts = [(await client.get("/")).text]
        clock.advance(10)
        texts += [(await client.get("/")).text for _ in range(3)]
    assert storage.calls == 2  # the last three from the cache
    first = int(texts[0].split()[1])
    assert texts[1:] == [f"wait {first - 10}"] * 3
    assert len(seen) == 4


async def test_other_keys_are_counted_apart(clock: FakeClock, memory: MemoryStorage) -> None:
    """One client's denials don't affect another client's quota."""
    app = make_app(tiers=[Tier("t", "1/minute")], storage=memory, clock=clock)
    async with client_for(app) as one, client_for(app, ("198.51.100.1", 1)) as two:
        await one.get("/")
        assert (await one.get("/")).status_code == 429
        assert (await two.get("/")).status_code == 200


async def test_streaming_response_keeps_streaming(clock: FakeClock, memory: MemoryStorage) -> None:
    """A streaming endpoint's chunks go out as separate ASGI messages, headers first."""
    app = make_app(tiers=[Tier("t", "5/minute")], storage=memory, clock=clock)
    sent: list[Any] = []
    requests = [{"type": "http.request", "body": b"", "more_body": False}]
    never = asyncio.Event()

    async def receive() -> Any:
        if requests:
            return requests.pop()
        await never.wait()  # the client stays connected until the stream ends
        return {"type": "http.disconnect"}

    async def send(message: Any) -> None:
        sent.append(message)

    scope = {"type": "http", "method": "GET", "path": "/stream", "raw_path": b"/stream",
             "root_path": "", "scheme": "http", "query_string": b"", "headers": [],
             "client": ("203.0.113.7", 1), "server": ("test", 80), "http_version": "1.1",
             "asgi": {"version": "3.0"}}
    await app(scope, receive, send)
    assert sent[0]["type"] == "http.response.start"
    assert (b"x-ratelimit-remaining", b"4") in sent[0]["headers"]
    bodies = [m["body"] for m in sent[1:] if m.get("body")]
    assert bodies == [b"chunk0;", b"chunk1;", b"chunk2;"]


async def test_non_http_scopes_pass_through_untouched(memory: MemoryStorage) -> None:
    """A websocket and lifespan scope reach the app exactly as sent."""
    seen: list[Scope] = []

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        seen.append(scope)

    middleware = RateLimitMiddleware(app, tiers=[Tier("t", "1/minute")], storage=memory)
    websocket: Scope = {"type": "websocket", "path": "/ws", "headers": []}

    async def nothing() -> Any:
        return {}

    async def drop(message: Any) -> None:
        return None

    await middleware(websocket, nothing, drop)
    await middleware({"type": "lifespan"}, nothing, drop)
    assert seen[0] is websocket
    assert seen[1] == {"type": "lifespan"}


async def _connect(app: Any) -> list[Any]:
    """Open one websocket to ``/ws`` with raw ASGI messages; return what the app sent."""
    sent: list[Any] = []
    incoming = [{"type": "websocket.connect"}, {"type": "websocket.disconnect", "code": 1000}]

    async def receive() -> Any:
        return incoming.pop(0) if incoming else {"type": "websocket.disconnect", "code": 1000}

    async def send(message: Any) -> None:
        sent.append(message)

    scope = {"type": "websocket", "path": "/ws", "raw_path": b"/ws", "root_path": "",
             "scheme": "ws", "query_string": b"", "headers": [], "client": ("203.0.113.7", 1),
             "server": ("test", 80), "subprotocols": [], "asgi": {"version": "3.0"}}
    await app(scope, receive, send)
    return sent


async def test_websocket_connects_limited_when_opted_in(
    clock: FakeClock, memory: MemoryStorage,
) -> None:
    """With limit_websockets, a connect over the limit is closed with 1008."""
    async def echo(websocket: WebSocket) -> None:
        await websocket.accept()
        await websocket.send_text("hi")
        await websocket.close()

    app = make_app([WebSocketRoute("/ws", echo)], tiers=[Tier("t", "1/minute")],
                   storage=memory, clock=clock, limit_websockets=True)
    first = await _connect(app)
    second = await _connect(app)
    assert [m["type"] for m in first] == ["websocket.accept", "websocket.send",
                                          "websocket.close"]
    assert second == [{"type": "websocket.close", "code": 1008,
                       "reason": "rate limit exceeded"}]


async def test_fastapi_app(clock: FakeClock, memory: MemoryStorage) -> None:
    """add_middleware works on FastAPI the same way."""
    api = FastAPI()

    @api.get("/items")
    async def items() -> dict[str, int]:
        return {"n": 1}

    api.add_middleware(RateLimitMiddleware, tiers=[Tier("t", "1/minute")], storage=memory,
                       clock=clock)
    async with client_for(api) as client:
        assert (await client.get("/items")).json() == {"n": 1}
        assert (await client.get("/items")).status_code == 429


async def test_global_shadow_never_blocks(
    clock: FakeClock, memory: MemoryStorage, caplog: pytest.LogCaptureFixture,
) -> None:
    """In shadow mode, requests over the limit pass, with headers and a log line."""
    app = make_app(tiers=[Tier("t", "2/minute")], storage=memory, clock=clock, shadow=True)
    caplog.set_level(logging.INFO, logger="ratelimit_mw")
    async with client_for(app) as client:
        responses = [await client.get("/") for _ in range(5)]
    assert [r.status_code for r in responses] == [200] * 5
    assert responses[-1].headers["x-ratelimit-remaining"] == "0"
    denials = [r for r in caplog.records if getattr(r, "ratelimit", {}).get("event")
               == "rate_limited"]
    assert len(denials) == 3
    assert all(r.ratelimit["shadow"] for r in denials)  # type: ignore[attr-defined]


async def test_shadow_limit_reports_but_enforced_limit_counts(
    clock: FakeClock, memory: MemoryStorage, caplog: pytest.LogCaptureFixture,
) -> None:
    """A shadow limit never blocks, and requests it would deny still count on the others;
    each request it would deny is logged as a shadow denial of that limit."""
    tier = Tier("t", [Limit("2/minute", "fixed_window", name="strict"),
                      Limit("4/minute", "fixed_window", name="loose")],
                shadow=frozenset({"strict"}))
    app = make_app(tiers=[tier], storage=memory, clock=clock, header_style="draft-11")
    with caplog.at_level(logging.INFO, logger="ratelimit_mw"):
        async with client_for(app) as client:
            codes = [(await client.get("/")).status_code for _ in range(5)]
            last = await client.get("/")
    assert codes == [200, 200, 200, 200, 429]
    assert '"loose";r=0' in last.headers["ratelimit"]
    logged = [r.ratelimit for r in caplog.records if hasattr(r, "ratelimit")]  # type: ignore[attr-defined]
    assert [(f["policy"], f["shadow"]) for f in logged] == [
        ("strict", True), ("strict", True), ("loose", False), ("loose", False)]


async def test_a_shadow_limit_does_not_set_the_wait_of_a_real_denial(
    clock: FakeClock, memory: MemoryStorage,
) -> None:
    """When an enforced limit denies, a shadow limit that also denies changes neither
    Retry-After nor the reported policy: the client is told the enforced limit's wait."""
    tier = Tier("t", [Limit("2/minute", "fixed_window", name="minute"),
                      Limit("1/hour", "fixed_window", name="hour")],
                shadow=frozenset({"hour"}))
    app = make_app(tiers=[tier], storage=memory, clock=clock)
    async with client_for(app) as client:
        codes = [(await client.get("/")).status_code for _ in range(2)]
        denied = await client.get("/")
    assert codes == [200, 200]
    assert denied.status_code == 429
    assert 0 < int(denied.headers["retry-after"]) <= 60
    assert denied.headers["x-ratelimit-policy"].startswith("2;w=60")
    body = denied.json()
    assert (body["limit"], body["window"]) == (2, "60s")
    assert body["retry_after_seconds"] == int(denied.headers["retry-after"])


@pytest.mark.parametrize(("limit", "window"), [
    (Limit("1/12 days", "fixed_window"), "1036800s"),
    (Limit.monthly(1), "2592000s"),
    (Limit(Rate(1, 0.25), "fixed_window"), "0.25s"),
])
async def test_the_429_window_is_plain_seconds(
    clock: FakeClock, memory: MemoryStorage, limit: Limit, window: str,
) -> None:
    """Long and fractional periods too: ``1036800s``, never ``1.0368e+06s``."""
    app = make_app(tiers=[Tier("t", [limit])], storage=memory, clock=clock)
    async with client_for(app) as client:
        assert (await client.get("/")).status_code == 200
        denied = await client.get("/")
    assert denied.status_code == 429
    assert denied.json()["window"] == window


async def test_a_memory_storage_subclass_keeps_its_overrides(clock: FakeClock) -> None:
    """A MemoryStorage subclass that overrides decide and release (tracing, say) has them
    called, rather than the in-place fast path."""
    calls: list[str] = []

    class Traced(MemoryStorage):
        async def decide(self, key: str, hits: Sequence[Hit], *,
                         usage: bool = False) -> Verdict:
            calls.append("decide")
            return await super().decide(key, hits, usage=usage)

        async def release(self, leases: Sequence[Lease]) -> None:
            calls.append("release")
            await super().release(leases)

    app = make_app(tiers=[Tier("t", "5/minute", concurrency=2)], storage=Traced(clock=clock),
                   clock=clock)
    async with client_for(app) as client:
        assert (await client.get("/")).status_code == 200
    assert calls == ["decide", "release"]


async def test_decision_hook_sees_every_decision(clock: FakeClock, memory: MemoryStorage) -> None:
    """on_decision receives one event per limited request, refused or not (memory
    storage decides every one; a shared storage's blocked keys are answered locally)."""
    for storage, third in ((memory, "storage"), (Counting(MemoryStorage()), "blocked")):
        events: list[DecisionEvent] = []
        app = make_app(tiers=[Tier("t", "1/minute")], storage=storage, clock=clock,
                       on_decision=events.append)
        async with client_for(app) as client:
            for _ in range(3):
                await client.get("/")
        assert [(e.refused, e.source) for e in events] == [
            (False, "storage"), (True, "storage"), (True, third)]
    assert events[0].key == "ip:203.0.113.7"


async def test_the_decision_hook_sees_a_shadow_limits_denial_as_shadow(
    clock: FakeClock, memory: MemoryStorage,
) -> None:
    """A request a shadow limit denies and lets through is a shadow denial for the hook,
    as for the log line (global shadow mode or not)."""
    events: list[DecisionEvent] = []
    tier = Tier("t", [Limit("100/minute", name="loose"),
                      Limit("1/minute", name="tight")], shadow=frozenset({"tight"}))
    app = make_app(tiers=[tier], storage=memory, clock=clock, on_decision=events.append)
    async with client_for(app) as client:
        codes = [(await client.get("/")).status_code for _ in range(2)]
    assert codes == [200, 200]
    assert [(e.refused, e.shadow) for e in events] == [(False, False), (False, True)]


def test_an_async_decision_hook_is_refused_at_start_up(memory: MemoryStorage) -> None:
    """It would never be awaited (no metrics, a warning per request): refused, named."""
    async def hook(event: DecisionEvent) -> None:
        pass

    with pytest.raises(TypeError, match=r"on_decision must be a plain \(not async\) function"):
        RateLimitMiddleware(PlainTextResponse("ok"), storage=memory, on_decision=hook)


async def test_broken_decision_hook_is_logged_not_raised(
    clock: FakeClock, memory: MemoryStorage, caplog: pytest.LogCaptureFixture,
) -> None:
    """A metrics hook that raises does not fail the request."""
    def broken(event: DecisionEvent) -> None:
        raise RuntimeError("metrics down")

    app = make_app(tiers=[Tier("t", "1/minute")], storage=memory, clock=clock,
                   on_decision=broken)
    async with client_for(app) as client:
        assert (await client.get("/")).status_code == 200
    assert "on_decision hook raised" in caplog.text


async def test_one_log_line_per_denial(
    clock: FakeClock, memory: MemoryStorage, caplog: pytest.LogCaptureFixture,
) -> None:
    """Each denial logs one structured line on the ratelimit_mw logger."""
    caplog.set_level(logging.INFO, logger="ratelimit_mw")
    app = make_app(tiers=[Tier("t", [Limit("1/minute", name="m")])], storage=memory,
                   clock=clock)
    async with client_for(app) as client:
        for _ in range(3):
            await client.get("/")
    lines = [r for r in caplog.records if r.name == "ratelimit_mw"]
    assert len(lines) == 2
    fields = lines[0].ratelimit  # type: ignore[attr-defined]
    assert fields["event"] == "rate_limited"
    assert fields["policy"] == "m"
    assert fields["key"] == "ip:203.0.113.7"
    json.dumps(fields)


async def test_key_none_means_unlimited(clock: FakeClock, memory: MemoryStorage) -> None:
    """A key function returning None leaves the request unlimited (e.g. an allow list)."""
    app = make_app(tiers=[Tier("t", "1/minute")], storage=memory, clock=clock,
                   key=lambda scope: None)
    async with client_for(app) as client:
        responses = [await client.get("/") for _ in range(3)]
    assert all(r.status_code == 200 and "x-ratelimit-limit" not in r.headers
               for r in responses)


async def test_async_key_function(clock: FakeClock, memory: MemoryStorage) -> None:
    """An async key function is awaited; its key separates the counters."""
    async def by_tenant(scope: Scope) -> str:
        return "tenant:" + dict(scope["headers"]).get(b"x-tenant", b"-").decode()

    app = make_app(tiers=[Tier("t", "1/minute")], storage=memory, clock=clock, key=by_tenant)
    async with client_for(app) as client:
        assert (await client.get("/", headers={"x-tenant": "a"})).status_code == 200
        assert (await client.get("/", headers={"x-tenant": "a"})).status_code == 429
        assert (await client.get("/", headers={"x-tenant": "b"})).status_code == 200


def test_starlette_routes_helper_is_used() -> None:
    """(Sanity) the default test app has the routes the tests rely on."""
    app = Starlette(routes=[Route("/", ok)])
    assert [r.path for r in app.routes] == ["/"]  # type: ignore[attr-defined]

"""What the middleware sends on, and when it refuses: headers added to a copy of the
app's response start (its own headers win), the closed failure mode on a second call,
shadow mode with a storage down, the cached denial's Retry-After."""

from __future__ import annotations

from typing import Any

import pytest
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route
from starlette.types import Message, Receive, Scope, Send

from ratelimit_mw import Limit, MemoryStorage
from ratelimit_mw.errors import StorageError
from ratelimit_mw.middleware import RateLimitMiddleware
from ratelimit_mw.tiers import Tier
from tests.conftest import FakeClock

from .conftest import client_for, make_app, ok


async def test_the_apps_response_start_is_not_changed() -> None:
    """Headers go on a copy of the start message: whoever sent it (an idempotency
    layer keeping a record of the response, say) still holds what it sent."""
    sent: list[Message] = []

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        start = {"type": "http.response.start", "status": 200,
                 "headers": [(b"content-length", b"2")]}
        sent.append(start)
        await send(start)
        await send({"type": "http.response.body", "body": b"ok"})

    limited = RateLimitMiddleware(app, tiers=[Tier("t", "5/minute")], storage=MemoryStorage())
    async with client_for(limited) as client:
        response = await client.get("/")
    assert response.headers["x-ratelimit-remaining"] == "4"
    assert sent[0]["headers"] == [(b"content-length", b"2")]


async def test_headers_the_app_sets_itself_are_not_sent_twice(
    clock: FakeClock, memory: MemoryStorage,
) -> None:
    """An app passing on an upstream's X-RateLimit-* keeps them; the middleware adds
    only the names the app did not set (two of one name is unreadable for clients)."""
    async def proxied(request: Request) -> Response:
        return PlainTextResponse("ok", headers={"X-RateLimit-Limit": "5000",
                                                "X-RateLimit-Remaining": "4999"})

    app = make_app([Route("/", proxied)], tiers=[Tier("t", "5/minute")], storage=memory,
                   clock=clock)
    async with client_for(app) as client:
        response = await client.get("/")
    assert response.headers.get_list("x-ratelimit-limit") == ["5000"]
    assert response.headers.get_list("x-ratelimit-remaining") == ["4999"]
    assert len(response.headers.get_list("x-ratelimit-reset")) == 1  # the middleware's


class _OwnStorage(MemoryStorage):
    """A storage of the user's own: the middleware holds its slots on the general path."""

    async def release(self, leases: Any) -> None:
        await super().release(leases)


@pytest.mark.parametrize("storage", [MemoryStorage, _OwnStorage])
async def test_a_request_holding_a_slot_gets_its_headers_the_same_way(
    storage: type[MemoryStorage],
) -> None:
    """With a concurrency slot taken, on every storage: the app's own headers win and
    its start message is left as it sent it (the general path appended to it)."""
    sent: list[Message] = []

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        start = {"type": "http.response.start", "status": 200,
                 "headers": [(b"content-length", b"2"), (b"x-ratelimit-limit", b"5000")]}
        sent.append(start)
        await send(start)
        await send({"type": "http.response.body", "body": b"ok"})

    limited = RateLimitMiddleware(app, tiers=[Tier("t", "5/minute", concurrency=5)],
                                  storage=storage())
    async with client_for(limited) as client:
        response = await client.get("/")
    assert response.headers.get_list("x-ratelimit-limit") == ["5000"]
    assert response.headers.get_list("x-ratelimit-remaining") == ["4"]
    assert sent[0]["headers"] == [(b"content-length", b"2"), (b"x-ratelimit-limit", b"5000")]


class _FailsAfterADenial(MemoryStorage):
    """Answers until it has denied once, then fails (Redis going away in between)."""

    down = False

    async def decide(self, key: str, hits: Any, **options: Any) -> Any:
        if self.down:
            raise StorageError("redis went away")
        verdict = await super().decide(key, hits, **options)
        self.down = not verdict.allowed
        return verdict


def _shadowed_tier() -> list[Tier]:
    return [Tier("t", [Limit("2/minute", "fixed_window", name="enforced"),
                       Limit("1/minute", "fixed_window", name="trial")],
                 shadow=["trial"])]


async def test_closed_refuses_when_the_enforced_limits_cant_be_decided(
    clock: FakeClock,
) -> None:
    """Denied by a shadow limit only, a request needs a second call for the enforced
    limits; in closed mode, that call failing is a 503, not a request let through
    undecided."""
    storage = _FailsAfterADenial(clock=clock)
    app = make_app(tiers=_shadowed_tier(), storage=storage, clock=clock,
                   failure_mode="closed")
    async with client_for(app) as client:
        first = await client.get("/")
        second = await client.get("/")
    assert first.status_code == 200
    assert storage.down
    assert second.status_code == 503


async def test_shadow_mode_never_refuses_even_closed(clock: FakeClock) -> None:
    """Shadow mode (decide and report, never refuse) lets requests through while the
    storage is down, whatever the failure mode."""
    storage = _FailsAfterADenial(clock=clock)
    storage.down = True
    app = make_app(tiers=[Tier("t", "1/minute")], storage=storage, clock=clock,
                   failure_mode="closed", shadow=True)
    async with client_for(app) as client:
        codes = [(await client.get("/")).status_code for _ in range(3)]
    assert codes == [200, 200, 200]


@pytest.mark.parametrize("trip", [0.3, 0.8])
async def test_a_cached_denial_never_points_earlier_than_the_real_wait(
    trip: float,
) -> None:
    """The cache of blocked keys counts a denial's wait from after the storage answered:
    counted from before a slow round trip, its Retry-After came a second too early."""
    clock = FakeClock(1_700_000_000.0)  # a multiple of 10 s: a fixed window starts

    class Slow(MemoryStorage):
        async def decide(self, key: str, hits: Any, **options: Any) -> Any:
            clock.advance(trip)  # the round trip: the storage decides this much later
            return await super().decide(key, hits, **options)

    app = make_app([Route("/", ok)], tiers=[Tier("t", [Limit("1/10 seconds",
                                                                   "fixed_window")])],
                   storage=Slow(clock=clock), clock=clock, storage_timeout=2.0)
    async with client_for(app) as client:
        assert (await client.get("/")).status_code == 200
        assert (await client.get("/")).status_code == 429
        clock.now = 1_700_000_008.5
        cached = await client.get("/")
    assert cached.status_code == 429
    assert int(cached.headers["retry-after"]) >= 10 - 8.5


class _Awaited(MemoryStorage):
    """Memory storage decided the way any other storage is (awaited, through the guard)."""

    async def decide(self, key: str, hits: Any, **options: Any) -> Any:
        return await super().decide(key, hits, **options)


@pytest.mark.parametrize("kind", [MemoryStorage, _Awaited])
async def test_global_shadow_mode_counts_what_enforcing_would(
    clock: FakeClock, kind: type[MemoryStorage],
) -> None:
    """In shadow mode, a request only a shadow limit denies still counts on the limits
    that would be enforced (a second call, as without shadow mode), so the headers say
    what enforcing them would."""
    app = make_app(tiers=_shadowed_tier(), storage=kind(clock=clock), clock=clock, shadow=True)
    async with client_for(app) as client:
        responses = [await client.get("/") for _ in range(3)]
    assert [r.status_code for r in responses] == [200, 200, 200]
    assert [r.headers["x-ratelimit-remaining"] for r in responses] == ["1", "0", "0"]

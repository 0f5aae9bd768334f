"""Charges the response decides: reserve before the app runs, settle after the response.

Every storage of the matrix (memory, Redis) runs each case; ``storage`` is the
fixture of ``tests/conftest.py``.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from ratelimit_mw import (
    ConfigError,
    Limit,
    RateLimitMiddleware,
    Storage,
    Tier,
    json_field,
    limit,
    spends,
)
from ratelimit_mw.charges import cost_from, cost_from_header, cost_from_state
from tests.conftest import FakeClock

from .conftest import CLIENT, client_for, make_app, token_stream_app

FAILURES = Limit("5/15 minutes", "fixed_window", name="login-failures", count="failures")


def login_app(storage: Storage, entered: list[str] | None = None, **options: Any) -> Any:
    """``POST /login`` (JSON ``password``): 200 for ``correct-horse``, else 401; counted
    by a limit of 5 failures, on top of a roomy tier."""
    @limit(FAILURES)
    async def login(request: Request) -> Response:
        password = (await request.json()).get("password")
        if entered is not None:
            entered.append(password)
            await asyncio.sleep(0.05)  # the burst's requests overlap in the handler
        if password == "correct-horse":
            return JSONResponse({"ok": True})
        return JSONResponse({"error": "wrong password"}, status_code=401)

    options.setdefault("storage_timeout", 5.0)  # a loaded host: no decision fails open
    return make_app([Route("/login", login, methods=["POST"])],
                    tiers=[Tier("t", "1000/minute")], storage=storage, **options)


async def test_only_failures_count(storage: Storage) -> None:
    """Successes never count: six good logins, four bad, two good, one bad all pass;
    the next bad one is the sixth failure and gets a 429."""
    app = login_app(storage)
    async with client_for(app) as client:
        def attempt(password: str) -> Any:
            return client.post("/login", json={"password": password})

        codes = [(await attempt("correct-horse")).status_code for _ in range(6)]
        codes += [(await attempt("wrong")).status_code for _ in range(4)]
        codes += [(await attempt("correct-horse")).status_code for _ in range(2)]
        codes += [(await attempt("wrong")).status_code]
        refused = await attempt("wrong")
    assert codes == [200] * 6 + [401] * 4 + [200] * 2 + [401]
    assert refused.status_code == 429
    assert int(refused.headers["retry-after"]) > 0


async def test_a_burst_of_failures_never_overshoots(storage: Storage) -> None:
    """100 concurrent wrong passwords: the estimate is reserved before the handler
    runs, so at most 5 reach it; every other one is refused with 429."""
    entered: list[str] = []
    # Time enough for a hundred decisions at once (else they fail open, uncounted).
    app = login_app(storage, entered, storage_timeout=10.0)
    async with client_for(app) as client:
        responses = await asyncio.gather(*(
            client.post("/login", json={"password": f"guess-{i}"}) for i in range(100)))
    codes = sorted(r.status_code for r in responses)
    assert len(entered) <= 5
    assert codes.count(401) == len(entered)
    assert codes.count(429) == 100 - len(entered)


async def test_a_right_password_is_refused_only_by_its_callers_failures(
    storage: Storage,
) -> None:
    """Once one client has failed 5 times it is refused, right password or not; a
    client of another address is not."""
    app = login_app(storage)
    async with client_for(app) as client, client_for(app, ("198.51.100.9", 1)) as other:
        for _ in range(5):
            await client.post("/login", json={"password": "wrong"})
        mine = await client.post("/login", json={"password": "correct-horse"})
        theirs = await other.post("/login", json={"password": "correct-horse"})
    assert mine.status_code == 429
    assert theirs.status_code == 200


def metered_app(storage: Storage, cost: Any, **options: Any) -> Any:
    """``GET /complete?n=N`` answers with an ``X-Tokens-Used: N`` header; the tier's
    tokens limit of 1000 a minute applies where a route spends tokens: ``/complete``
    reserves 100 and settles by ``cost``; ``/hello`` spends none."""
    tokens = Limit("1000/minute", "token_bucket", name="tokens", unit="tokens", cost=cost)

    @spends("tokens", estimate=100)
    async def complete(request: Request) -> Response:
        used = request.query_params.get("n", "0")
        request.state.tokens = int(used)
        return PlainTextResponse("done", headers={"X-Tokens-Used": used})

    async def hello(request: Request) -> Response:
        return PlainTextResponse("hello")

    options.setdefault("storage_timeout", 5.0)  # a loaded host: no decision fails open
    return make_app([Route("/complete", complete), Route("/hello", hello)],
                    tiers=[Tier("t", [Limit("100/minute", name="requests"), tokens])],
                    storage=storage, header_style="legacy+draft-11", **options)


@pytest.mark.parametrize("reader", [
    cost_from_header("x-tokens-used"), cost_from_state("tokens"),
    cost_from(lambda status, headers: int(headers["x-tokens-used"])),
], ids=["header", "state", "function"])
async def test_the_real_cost_is_settled_up_and_down(storage: Storage, reader: Any) -> None:
    """The next request sees what the last one really cost: 300 of 1000 tokens taken
    (estimate 100, settled +200), then 40 (settled -60)."""
    app = metered_app(storage, reader)
    async with client_for(app) as client:
        first = await client.get("/complete", params={"n": 300})
        hello = await client.get("/hello")
        second = await client.get("/complete", params={"n": 40})
        third = await client.get("/complete", params={"n": 100})
    assert "x-ratelimit-remaining-tokens" not in hello.headers  # it spends no tokens
    assert hello.headers["x-ratelimit-remaining"] == "98"
    # Each response reports the reservation (estimate 100) of its own request.
    assert first.headers["x-ratelimit-remaining-tokens"] == "900"
    assert second.headers["x-ratelimit-remaining-tokens"] == "600"  # 1000-300-100
    assert third.headers["x-ratelimit-remaining-tokens"] == "560"  # 1000-300-40-100
    assert '"tokens";r=560;' in third.headers["ratelimit"]
    assert third.headers["x-ratelimit-remaining"] == "96"  # requests: its own policy


async def test_the_usage_history_counts_what_was_spent(storage: Storage,
                                                       clock: FakeClock) -> None:
    """With usage history, each request counts one request and the tokens it settled
    at (300, then 40, then 100 as estimated); requests that spend none add no tokens."""
    app = metered_app(storage, cost_from_header("x-tokens-used"), quota_history=True)
    async with client_for(app) as client:
        for n in (300, 40, 100):
            await client.get("/complete", params={"n": n})
        await client.get("/hello")
    now = clock.now
    key = f"ip:{CLIENT[0]}"
    requests = await storage.usage(key, "hour", now - 7200, now + 7200)
    tokens = await storage.usage(key, "day", now - 2 * 86400, now + 2 * 86400, "tokens")
    assert sum(count for _, count in requests) == 4
    assert sum(count for _, count in tokens) == 300 + 40 + 100


async def test_a_cost_header_can_be_kept_from_the_client(storage: Storage) -> None:
    """``remove=True``: the app's cost header is read, then taken out of the response."""
    app = metered_app(storage, cost_from_header("x-tokens-used", remove=True))
    async with client_for(app) as client:
        first = await client.get("/complete", params={"n": 300})
        second = await client.get("/complete", params={"n": 0})
    assert "x-tokens-used" not in first.headers
    assert second.headers["x-ratelimit-remaining-tokens"] == "600"


async def test_a_cost_beyond_what_is_left_is_debt(storage: Storage) -> None:
    """A response that cost 1500 of the 1000 tokens leaves the caller in debt: the next
    request's estimate does not fit, a 429 says when the debt will have refilled."""
    app = metered_app(storage, cost_from_header("x-tokens-used"))
    async with client_for(app) as client:
        spent = await client.get("/complete", params={"n": 1500})
        refused = await client.get("/complete", params={"n": 10})
    assert spent.status_code == 200
    assert refused.status_code == 429
    assert refused.headers["x-ratelimit-remaining-tokens"] == "0"
    # 600 tokens to refill (500 of debt and the 100 reserved) at 1000 a minute: 36 s.
    assert 35 <= int(refused.headers["retry-after"]) <= 37


async def test_a_stream_settles_when_its_body_ends(storage: Storage) -> None:
    """A server-sent-events stream reports its usage in its last event; the middleware
    settles at the end of the body, from what the app put in the request's state."""
    app = token_stream_app(0, 250, storage=storage, storage_timeout=5.0)
    async with client_for(app) as client:
        streamed = await client.get("/stream")
        after = await client.get("/quiet")
    assert streamed.text.endswith('{"usage": {"total_tokens": 250}}\n\n')
    assert after.headers["x-ratelimit-remaining-tokens"] == "650"  # 1000 - 250 - its own 100


async def test_an_app_that_raises_settles_as_its_500(storage: Storage) -> None:
    """A handler that raises counts as the failure its 500 is."""
    @limit(FAILURES)
    async def broken(request: Request) -> Response:
        raise RuntimeError("boom")

    app = make_app([Route("/broken", broken)], tiers=[Tier("t", "1000/minute")],
                   storage=storage, storage_timeout=5.0)
    async with client_for(app) as client:
        for _ in range(5):
            with pytest.raises(RuntimeError):
                await client.get("/broken")
        refused = await client.get("/broken")
    assert refused.status_code == 429


def test_a_storage_that_cant_settle_is_refused_at_start_up() -> None:
    """A limit that settles after the response on a storage without ``settle``: a
    ConfigError naming the limit, when the middleware is made."""
    class Plain(Storage):
        async def decide(self, key: str, hits: Any, *, usage: int = 0) -> Any: ...
        async def release(self, leases: Any) -> None: ...
        async def usage(self, *args: Any) -> Any: ...
        async def reset(self, key: str) -> None: ...

    async def app(scope: Any, receive: Any, send: Any) -> None: ...

    with pytest.raises(ConfigError, match="login-failures"):
        RateLimitMiddleware(app, tiers=[Tier("t", [FAILURES])], storage=Plain())


async def test_failures_count_per_username(storage: Storage) -> None:
    """``per=json_field("username")``: five failures for alice refuse alice, not bob,
    from the same client; the handler still reads the whole body."""
    per_user = Limit("5/15 minutes", "fixed_window", name="login-failures",
                     count="failures", per=json_field("username"))

    @limit(per_user)
    async def login(request: Request) -> Response:
        try:
            data = await request.json()
        except ValueError:
            data = {}
        if data.get("password") == "correct-horse":
            return JSONResponse({"user": data["username"]})
        return JSONResponse({"error": "wrong password"}, status_code=401)

    app = make_app([Route("/login", login, methods=["POST"])],
                   tiers=[Tier("t", "1000/minute")], storage=storage, storage_timeout=5.0)
    async with client_for(app) as client:
        def attempt(user: str, password: str = "wrong") -> Any:
            return client.post("/login", json={"username": user, "password": password})

        alice = [(await attempt("alice")).status_code for _ in range(6)]
        bob = await attempt("bob", "correct-horse")
        nobody = [(await client.post("/login", content=b"not json")).status_code
                  for _ in range(6)]
    assert alice == [401] * 5 + [429]
    assert bob.status_code == 200 and bob.json() == {"user": "bob"}
    assert nobody == [401] * 5 + [429]  # no username: one shared count, never none

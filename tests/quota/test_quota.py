"""The quota endpoints in process, on a fake clock: numbers, periods, history, identity."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route

from ratelimit_mw import (
    Limit,
    MemoryStorage,
    RateLimitSettings,
    RedisStorage,
    Storage,
    StorageError,
)
from ratelimit_mw.middleware import RateLimitMiddleware
from ratelimit_mw.quota import quota_router
from ratelimit_mw.tiers import Tier, TierByAPIKey
from tests.conftest import FakeClock, middleware_arguments, on_clock

JAN_31 = datetime(2024, 1, 31, 23, 58, 30, tzinfo=UTC).timestamp()
KEYS = {"key-a": "gold", "key-b": "basic"}
A = {"X-API-Key": "key-a"}
B = {"X-API-Key": "key-b"}
QUOTA = "/api/v1/account/quota"
HISTORY = "/api/v1/account/quota/history"

TIERS = [
    Tier("basic", [Limit("100/minute", "fixed_window", name="minute")]),
    Tier("gold", [Limit("60/minute", "fixed_window", name="minute"),
                  Limit("1000/day", "fixed_window", name="day"),
                  Limit.monthly(5)], concurrency=3),
]


async def hello(request: Request) -> Response:
    return PlainTextResponse("hello")


Build = Callable[..., httpx.AsyncClient]


@pytest.fixture(params=["memory", pytest.param("redis", marks=pytest.mark.redis)])
async def build(
    request: pytest.FixtureRequest, clock: FakeClock,
) -> AsyncIterator[Build]:
    """``build(framework="starlette", **options)``: a client of an app with the quota
    endpoints behind the middleware, on memory or Redis, on the fake clock."""
    clock.now = JAN_31
    storages: list[Storage] = []
    clients: list[httpx.AsyncClient] = []

    def make(framework: str = "starlette", client: tuple[str, int] = ("198.51.100.4", 1),
             **options: Any) -> httpx.AsyncClient:
        if request.param == "memory":
            storage: Storage = MemoryStorage(clock=clock, usage_retention=options.pop(
                "retention", (168, 90)))
        else:
            storage = on_clock(RedisStorage.from_url(
                request.getfixturevalue("redis_url"),
                prefix=request.getfixturevalue("redis_prefix"),
                usage_retention=options.pop("retention", (168, 90))), clock)
        storages.append(storage)
        if framework == "fastapi":
            app: Any = FastAPI()
            app.add_api_route("/hello", hello)
            app.include_router(quota_router(allow_anonymous=options.pop("anonymous", False)))
        else:
            app = Starlette(routes=[Route("/hello", hello), *quota_router(
                allow_anonymous=options.pop("anonymous", False)).routes])
        options.setdefault("quota_history", True)
        app.add_middleware(RateLimitMiddleware, **middleware_arguments(
            tiers=options.pop("tiers", TIERS), key="api_key", tier_resolver=TierByAPIKey(KEYS),
            storage=storage, clock=clock, default_tier="basic", **options))
        made = httpx.AsyncClient(transport=httpx.ASGITransport(app=app, client=client),
                                 base_url="http://test")
        clients.append(made)
        return made

    yield make
    for made in clients:
        await made.aclose()
    for storage in storages:
        await storage.close()


@pytest.mark.parametrize("framework", ["starlette", "fastapi"])
async def test_quota_reports_plan_limits_usage_and_reset(build: Build, framework: str) -> None:
    """The seed's shape; this minute from the per-minute fixed window (exact here), today
    from the day bucket, the month from the calendar-month limit."""
    client = build(framework)
    for _ in range(3):
        assert (await client.get("/hello", headers=A)).status_code == 200
    quota = await client.get(QUOTA, headers=A)
    assert quota.status_code == 200
    assert quota.headers["cache-control"] == "no-store"
    assert quota.json() == {
        "plan": "gold",
        "period": "2024-01",
        "limits": {"requests_per_minute": 60, "requests_per_day": 1000,
                   "requests_per_month": 5},
        "usage": {"requests_today": 4, "requests_this_minute": 4, "requests_this_month": 4},
        "resets_at": "2024-02-01T00:00:00Z",
        "concurrency": {"limit": 3, "in_flight": 1},
    }


async def test_monthly_quota_resets_on_the_first(build: Build, clock: FakeClock) -> None:
    """5 per calendar month: the 6th request of January is refused until 1 February."""
    client = build()
    codes = [(await client.get("/hello", headers=A)).status_code for _ in range(6)]
    assert codes == [200] * 5 + [429]
    denied = await client.get("/hello", headers=A)
    assert int(denied.headers["retry-after"]) == 90  # 23:58:30 -> midnight
    clock.now = datetime(2024, 2, 1, 0, 0, 1, tzinfo=UTC).timestamp()
    assert (await client.get("/hello", headers=A)).status_code == 200
    quota = (await client.get(QUOTA, headers=A)).json()
    assert quota["period"] == "2024-02"
    assert quota["resets_at"] == "2024-03-01T00:00:00Z"
    assert quota["usage"] == {"requests_today": 2, "requests_this_minute": 2,
                              "requests_this_month": 2}


async def test_this_minute_follows_the_minute_window(build: Build, clock: FakeClock) -> None:
    """requests_this_minute is the per-minute limit's count: a new minute starts at 0,
    while the day goes on counting."""
    client = build()
    for _ in range(3):
        await client.get("/hello", headers=B)
    clock.advance(60)
    quota = (await client.get(QUOTA, headers=B)).json()
    assert quota["plan"] == "basic"
    assert quota["usage"]["requests_this_minute"] == 1  # only this request
    assert quota["usage"]["requests_today"] == 4  # 23:59:30: still the same UTC day


async def test_callers_only_see_their_own_numbers(build: Build) -> None:
    client = build()
    for _ in range(2):
        await client.get("/hello", headers=A)
    await client.get("/hello", headers=B)
    a = (await client.get(QUOTA, headers=A)).json()
    b = (await client.get(QUOTA, headers=B)).json()
    assert (a["plan"], a["usage"]["requests_today"]) == ("gold", 3)
    assert (b["plan"], b["usage"]["requests_today"]) == ("basic", 2)


async def test_without_credentials_401_unless_anonymous_is_allowed(build: Build) -> None:
    """A caller known only by IP gets 401, unless allow_anonymous; then its own numbers."""
    closed = build()
    assert (await closed.get(QUOTA)).status_code == 401
    assert (await closed.get(HISTORY)).status_code == 401
    opened = build(anonymous=True, client=("198.51.100.9", 1))
    await opened.get("/hello")
    quota = await opened.get(QUOTA)
    assert quota.status_code == 200
    assert quota.json()["usage"]["requests_today"] == 2


async def test_exempt_quota_path_still_knows_the_caller(build: Build) -> None:
    """Exempting the quota endpoints from limits doesn't lose who is asking."""
    client = build(exempt_paths=["/api/v1/account/*"])
    await client.get("/hello", headers=A)
    quota = await client.get(QUOTA, headers=A)
    assert quota.status_code == 200
    assert "x-ratelimit-limit" not in quota.headers
    assert quota.json()["usage"]["requests_today"] == 1


async def test_without_history_today_comes_from_the_daily_limit(build: Build) -> None:
    """quota_history off: requests_today is what the per-day limit counts; no history."""
    client = build(quota_history=False)
    for _ in range(2):
        await client.get("/hello", headers=A)
    quota = (await client.get(QUOTA, headers=A)).json()
    assert quota["usage"]["requests_today"] == 3
    basic = (await client.get(QUOTA, headers=B)).json()
    assert basic["usage"]["requests_today"] is None  # no per-day limit, no history
    assert (await client.get(HISTORY, headers=A)).status_code == 404


async def test_a_costly_route_counts_its_cost_in_the_quota_and_history(build: Build) -> None:
    """A route of cost 4 uses 4 of the limits per request: requests_today and the
    history count the same units, so the report agrees with the limits it shows."""
    client = build(routes=[{"path": "/hello", "cost": 4}])
    for _ in range(3):
        assert (await client.get("/hello", headers=B)).status_code == 200
    quota = (await client.get(QUOTA, headers=B)).json()
    # 3 x 4, and this report's 1, on the minute limit and in the day's history alike
    assert quota["usage"] == {"requests_today": 13, "requests_this_minute": 13}
    history = (await client.get(HISTORY, headers=B, params={"granularity": "day"})).json()
    assert history["total"] == 14  # and the report before
    # Gold's month (5) is spent by two: the one refused counts nothing anywhere.
    assert (await client.get("/hello", headers=A)).status_code == 200
    assert (await client.get("/hello", headers=A)).status_code == 429
    history = (await client.get(HISTORY, headers=A, params={"granularity": "day"})).json()
    assert history["total"] == 5  # 4, and this history request


async def test_history_hour_and_day_buckets(build: Build, clock: FakeClock) -> None:
    """Requests spread over hours and days land in their buckets; the sums add up."""
    client = build()
    clock.now = datetime(2024, 1, 30, 10, 15, tzinfo=UTC).timestamp()
    for _ in range(2):
        await client.get("/hello", headers=B)
    clock.now = datetime(2024, 1, 30, 12, 5, tzinfo=UTC).timestamp()
    await client.get("/hello", headers=B)
    clock.now = datetime(2024, 1, 31, 9, 0, tzinfo=UTC).timestamp()
    for _ in range(4):
        await client.get("/hello", headers=B)
    days = (await client.get(HISTORY, headers=B, params={
        "granularity": "day", "from": "2024-01-29", "to": "2024-01-31"})).json()
    assert days["buckets"] == [
        {"start": "2024-01-29T00:00:00Z", "requests": 0},
        {"start": "2024-01-30T00:00:00Z", "requests": 3},
        {"start": "2024-01-31T00:00:00Z", "requests": 5},  # 4 + this history request
    ]
    assert days["total"] == 8
    assert (days["from"], days["to"]) == ("2024-01-29T00:00:00Z", "2024-01-31T23:59:59Z")
    start = datetime(2024, 1, 30, 10, tzinfo=UTC).timestamp()
    hours = (await client.get(HISTORY, headers=B, params={
        "granularity": "hour", "from": str(int(start)), "to": "2024-01-30T12:59:59Z"})).json()
    assert [b["requests"] for b in hours["buckets"]] == [2, 0, 1]
    default = (await client.get(HISTORY, headers=B, params={"granularity": "hour"})).json()
    assert default["total"] == 10  # the last 24 hours: all 7, and the 3 history requests


@pytest.mark.parametrize(("params", "message"), [
    ({"granularity": "minute"}, "granularity must be"),
    ({"from": "yesterday"}, "couldn't read from="),
    ({"to": "nan"}, "out of range"),
    ({"from": "0001-01-01T00:00:00+01:00"}, "out of range"),
    ({"to": "9999-12-31T23:59:59-01:00"}, "out of range"),
    ({"from": "0001-01-01"}, "out of range"),
    ({"from": "2024-01-31", "to": "2024-01-30"}, "must not be after"),
])
async def test_history_refuses_bad_parameters(
    build: Build, params: dict[str, str], message: str,
) -> None:
    client = build()
    response = await client.get(HISTORY, headers=A, params=params)
    assert response.status_code == 400
    assert message in response.json()["message"]


async def test_a_shadow_limit_is_not_reported_as_the_callers_limit(
        build: Build, clock: FakeClock) -> None:
    """A tier's shadow limit (tried out, never blocking) is left out of the quota: the
    limit and the count this minute are the enforced limit's."""
    tiers = [Tier("basic", [Limit("100/minute", "fixed_window", name="minute"),
                            Limit("5/minute", "sliding_window", name="trial")],
                  shadow=["trial"]), TIERS[1]]
    client = build(tiers=tiers, anonymous=True)
    for _ in range(10):
        assert (await client.get("/hello")).status_code == 200
    quota = await client.get(QUOTA)
    assert quota.status_code == 200
    body = quota.json()
    assert body["limits"] == {"requests_per_minute": 100}
    assert body["usage"]["requests_this_minute"] == 11


async def test_history_keeps_only_the_retention(build: Build, clock: FakeClock) -> None:
    """usage_retention: 2 hours of hourly buckets; older ones are not reported."""
    client = build(retention=(2, 90))
    clock.now = datetime(2024, 1, 31, 6, 30, tzinfo=UTC).timestamp()
    await client.get("/hello", headers=B)
    clock.now = datetime(2024, 1, 31, 9, 30, tzinfo=UTC).timestamp()
    hours = (await client.get(HISTORY, headers=B, params={"granularity": "hour"})).json()
    assert [b["start"][11:13] for b in hours["buckets"]] == ["08", "09"]
    assert hours["total"] == 1  # this request; 06:00 is beyond the retention


async def test_the_endpoints_need_the_middleware() -> None:
    app = Starlette(routes=quota_router().routes)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        with pytest.raises(RuntimeError, match="need RateLimitMiddleware"):
            await client.get(QUOTA)


def test_settings_carry_the_retention() -> None:
    from ratelimit_mw import RateLimitSettings

    settings = RateLimitSettings(usage_retention_hours=24, usage_retention_days=30)
    assert tuple(settings.usage_retention) == (24, 30)
    with pytest.raises(ValueError, match="usage retention hours"):
        RateLimitSettings(usage_retention_hours=0)


@pytest.mark.redis
@pytest.mark.parametrize("behind", [1.5, 40.0])
async def test_on_redis_today_and_the_period_are_redis_s_whatever_the_app_clock(
    redis_url: str, redis_prefix: str, behind: float,
) -> None:
    """An app server whose clock is days behind Redis still reports Redis's today
    (within two days' skew) and month (Redis counts the usage on its own clock):
    skewed servers agree."""
    import time

    storage = RedisStorage.from_url(redis_url, prefix=redis_prefix, usage_retention=(168, 90))
    app = Starlette(routes=[Route("/", hello), *quota_router().routes])
    app.add_middleware(
        RateLimitMiddleware,
        storage=storage,
        tiers=TIERS,
        tier_resolver=TierByAPIKey(KEYS),
        key="api_key",
        clock=lambda: time.time() - 86_400 * behind,
        settings=RateLimitSettings(quota_history=True),
    )
    transport = httpx.ASGITransport(app=app, client=("198.51.100.4", 1))
    try:
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            for _ in range(3):
                await client.get("/", headers=A)
            body = (await client.get(QUOTA, headers=A)).json()
    finally:
        await storage.close()
    assert body["period"] == datetime.fromtimestamp(time.time(), UTC).strftime("%Y-%m")
    if behind < 2:
        assert body["usage"]["requests_today"] == 4  # the quota request counts too


async def test_while_the_storage_rests_the_quota_is_refused_at_once() -> None:
    """The quota endpoints read behind the storage's breaker, like the decisions: once it
    opened, a quota or history request is a 503 at once (with the breaker's
    Retry-After), without waiting out the storage's timeout again."""
    reads = 0

    class Down(MemoryStorage):
        async def decide(self, key: str, hits: Any, **options: Any) -> Any:
            raise StorageError("redis went away")

        async def peek(self, key: str, hits: Any) -> Any:
            nonlocal reads
            reads += 1
            raise StorageError("redis went away")

        async def usage(self, *args: Any) -> Any:
            nonlocal reads
            reads += 1
            raise StorageError("redis went away")

    app = Starlette(routes=[Route("/hello", hello), *quota_router().routes])
    app.add_middleware(
        RateLimitMiddleware,
        tiers=TIERS,
        key="api_key",
        tier_resolver=TierByAPIKey(KEYS),
        storage=Down(),
        settings=RateLimitSettings(quota_history=True, recovery_interval=30.0),
    )
    transport = httpx.ASGITransport(app=app, client=("198.51.100.4", 1))
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        for _ in range(20):  # the decisions fail (fail open) until the breaker opens
            await client.get("/hello", headers=A)
        quota = await client.get(QUOTA, headers=A)
        history = await client.get(HISTORY, headers=A)
    assert reads == 0
    for response in (quota, history):
        assert response.status_code == 503
        assert "can't be read right now; try again in" in response.json()["message"]
        assert int(response.headers["retry-after"]) >= 29


async def test_failing_quota_reads_leave_the_decisions_storage_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Reads of the quota that fail (a slow report) are not counted on the storage's
    breaker: the decisions go on being made by the storage, not skipped. The cause,
    which may name the storage's address, is logged, never sent to the caller."""
    class SlowReports(MemoryStorage):
        async def decide(self, key: str, hits: Any, **options: Any) -> Any:
            return await super().decide(key, hits, **options)  # through the guard

        async def usage(self, *args: Any) -> Any:
            raise StorageError("Error 111 connecting to 10.0.3.7:6379. Connection refused.")

    app = Starlette(routes=[Route("/hello", hello), *quota_router().routes])
    app.add_middleware(
        RateLimitMiddleware,
        tiers=TIERS,
        key="api_key",
        tier_resolver=TierByAPIKey(KEYS),
        storage=SlowReports(),
        settings=RateLimitSettings(quota_history=True),
    )
    transport = httpx.ASGITransport(app=app, client=("198.51.100.4", 1))
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        replies = [await client.get(HISTORY, headers=B) for _ in range(30)]
        greeted = await client.get("/hello", headers=B)
    assert [reply.status_code for reply in replies] == [503] * 30
    assert replies[0].json() == {
        "error": "quota_unavailable",
        "message": "The history can't be read right now; try again in 2s."}  # recovery_interval
    assert "10.0.3.7" in caplog.text and "event=quota_unavailable" in caplog.text
    assert caplog.text.count("event=quota_unavailable") == 1  # one line an outage, not 30
    assert greeted.headers["x-ratelimit-remaining"] == str(100 - 31)  # decided, not skipped


@pytest.mark.slow
async def test_a_stalled_quota_read_is_bounded() -> None:
    """A storage that stalls on the report (Redis in a long command): the quota
    endpoint answers 503 within its bound (ten times the decisions' timeout, a second
    at least), not when the storage wakes up."""
    import asyncio
    import time

    class Stalls(MemoryStorage):
        async def decide(self, key: str, hits: Any, **options: Any) -> Any:
            return await super().decide(key, hits, **options)  # through the guard

        async def usage(self, *args: Any) -> Any:
            await asyncio.sleep(30)

    app = Starlette(routes=[Route("/hello", hello), *quota_router().routes])
    app.add_middleware(
        RateLimitMiddleware,
        tiers=TIERS,
        key="api_key",
        tier_resolver=TierByAPIKey(KEYS),
        storage=Stalls(),
        settings=RateLimitSettings(quota_history=True),
    )
    transport = httpx.ASGITransport(app=app, client=("198.51.100.4", 1))
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        started = time.monotonic()
        response = await client.get(HISTORY, headers=B)
    assert response.status_code == 503
    assert response.json()["error"] == "quota_unavailable"
    assert time.monotonic() - started < 5

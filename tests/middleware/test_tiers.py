"""Tiers: limits of any algorithm, resolvers (sync and async), and start-up errors."""

from __future__ import annotations

import pytest
from starlette.applications import Starlette
from starlette.types import Scope

from ratelimit_mw import ConfigError, Limit, MemoryStorage, RateLimitSettings
from ratelimit_mw.middleware import RateLimitMiddleware
from ratelimit_mw.tiers import Tier, TierByAPIKey, TierFromHeader
from tests.conftest import FakeClock

from .conftest import client_for, make_app

FREE = Tier("free", [Limit("10/minute", "token_bucket", burst=20, name="burst"),
                     Limit("1000/day", name="daily")])
PRO = Tier("pro", [Limit("100/minute", name="minute")])


async def test_burst_20_plus_daily(clock: FakeClock, memory: MemoryStorage) -> None:
    """A burst of 20 passes at once, the 21st waits for a token; the day counts them all."""
    app = make_app(tiers=[FREE], storage=memory, clock=clock, header_style="draft-11")
    async with client_for(app) as client:
        burst = [await client.get("/") for _ in range(21)]
        assert [r.status_code for r in burst] == [200] * 20 + [429]
        assert burst[-1].headers["retry-after"] == "6"  # one token per 6 s at 10/minute
        clock.advance(6)
        refilled = await client.get("/")
    assert refilled.status_code == 200
    assert burst[0].headers["ratelimit-policy"] == '"burst";q=20;w=60,"daily";q=1000;w=86400'
    assert '"daily";r=979;' in refilled.headers["ratelimit"]


async def test_daily_limit_holds_across_bursts(clock: FakeClock, memory: MemoryStorage) -> None:
    """When the day's quota is spent, refilled burst tokens don't help."""
    tier = Tier("small", [Limit("10/minute", "token_bucket", burst=20, name="burst"),
                          Limit("25/day", name="daily")])
    app = make_app(tiers=[tier], storage=memory, clock=clock)
    async with client_for(app) as client:
        passed = 0
        for _ in range(10):
            for _ in range(20):
                passed += (await client.get("/")).status_code == 200
            clock.advance(120)
    assert passed == 25


async def test_async_tier_resolver(clock: FakeClock, memory: MemoryStorage) -> None:
    """An async resolver picks the tier (an API key -> plan lookup, say)."""
    plans = {"pro-key": "pro"}

    async def resolver(scope: Scope) -> str | None:
        headers = dict(scope["headers"])
        return plans.get(headers.get(b"x-api-key", b"").decode())

    app = make_app(tiers=[Tier("free", "1/minute"), PRO], storage=memory, clock=clock,
                   tier_resolver=resolver, key="api_key")
    async with client_for(app) as client:
        pro = [await client.get("/", headers={"x-api-key": "pro-key"}) for _ in range(3)]
        free = [await client.get("/", headers={"x-api-key": "other"}) for _ in range(2)]
    assert [r.status_code for r in pro] == [200, 200, 200]
    assert pro[0].headers["x-ratelimit-limit"] == "100"
    assert [r.status_code for r in free] == [200, 429]


async def test_client_cannot_pick_its_tier_by_default(
    clock: FakeClock, memory: MemoryStorage,
) -> None:
    """Without tier_header configured, a header naming a tier changes nothing."""
    app = make_app(tiers=[Tier("free", "1/minute"), PRO], storage=memory, clock=clock)
    async with client_for(app) as client:
        codes = [(await client.get("/", headers={"x-ratelimit-tier": "pro", "x-tier": "pro",
                                                 "x-plan": "pro"})).status_code
                 for _ in range(2)]
    assert codes == [200, 429]


async def test_tier_header_when_configured(clock: FakeClock, memory: MemoryStorage) -> None:
    """tier_header opts in to tiers named by a (gateway-set) header; unknown names: default."""
    app = make_app(tiers=[Tier("free", "1/minute"), PRO], storage=memory, clock=clock,
                   tier_header="x-plan")
    async with client_for(app) as client:
        assert (await client.get("/", headers={"x-plan": "pro"})).headers[
            "x-ratelimit-limit"] == "100"
        assert (await client.get("/", headers={"x-plan": "gold"})).headers[
            "x-ratelimit-limit"] == "1"


async def test_tier_header_is_believed_only_from_trusted_proxies(
    clock: FakeClock, memory: MemoryStorage, caplog: pytest.LogCaptureFixture,
) -> None:
    """With trusted proxies configured, the tier header counts only when the gateway
    sends it: a client reaching the app directly gets the default tier, whatever it
    claims. Without trusted proxies, every client's header counts, and a warning says
    so at start-up."""
    app = make_app(tiers=[Tier("free", "1/minute"), PRO], storage=memory, clock=clock,
                   tier_header="x-plan", trusted_proxies=["10.0.0.0/8"])
    async with client_for(app, client=("203.0.113.50", 4000)) as direct, \
            client_for(app, client=("10.0.0.1", 4000)) as gateway:
        claimed = [(await direct.get("/", headers={"x-plan": "pro"})).status_code
                   for _ in range(2)]
        through = await gateway.get("/", headers={"x-plan": "pro"})
    assert claimed == [200, 429]
    assert through.headers["x-ratelimit-limit"] == "100"
    assert "taken from the x-plan header of every client" not in caplog.text
    RateLimitMiddleware(
        Starlette().router,
        tiers=[Tier("free", "1/minute"), PRO],
        storage=memory,
        settings=RateLimitSettings(tier_header="x-plan"),
    )
    assert "taken from the x-plan header of every client" in caplog.text


def test_resolver_naming_unknown_tier_fails_at_startup(memory: MemoryStorage) -> None:
    """A resolver that can name a tier that doesn't exist is refused at start-up."""
    with pytest.raises(ConfigError, match="unknown tier 'gold'"):
        RateLimitMiddleware(Starlette().router, tiers=[FREE], storage=memory,
                            tier_resolver=TierByAPIKey({"k": "gold"}))
    with pytest.raises(ConfigError, match="unknown tier 'gold'"):
        RateLimitMiddleware(Starlette().router, tiers=[FREE], storage=memory,
                            tier_resolver=TierFromHeader("x-plan", allowed=["gold"]))


def test_unknown_default_tier_fails_at_startup(memory: MemoryStorage) -> None:
    """default_tier must be one of the tiers."""
    with pytest.raises(ConfigError, match="unknown tier 'gold'"):
        RateLimitMiddleware(
            Starlette().router,
            tiers=[FREE],
            storage=memory,
            settings=RateLimitSettings(default_tier="gold"),
        )


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"limits": "ten per minute"}, "couldn't parse rate"),
    ({"limits": [Limit("1/minute"), Limit("1/minute")]}, "two limits named"),
    ({"limits": "1/minute", "concurrency": 0}, "concurrency must be a positive integer"),
    ({"limits": "1/minute", "shadow": frozenset({"nope"})}, "shadow names unknown"),
])
def test_bad_tiers_are_config_errors(kwargs: dict[str, object], message: str) -> None:
    """Bad rates, duplicate names, a bad concurrency or shadow name fail when built."""
    with pytest.raises(ConfigError, match=message):
        Tier("t", **kwargs)  # type: ignore[arg-type]


def test_concurrency_is_parsed() -> None:
    """A tier keeps its concurrency limit (enforced by the middleware)."""
    assert Tier("t", "1/second", concurrency=4).concurrency == 4


def test_unknown_algorithm_is_a_config_error() -> None:
    """An unknown algorithm names the known ones."""
    with pytest.raises(ConfigError, match="unknown algorithm"):
        Tier("t", [Limit("1/minute", "leaky")])


def test_concurrency_limits_are_refused_in_limit_lists() -> None:
    """A concurrency Limit in a tier's list is refused: concurrency= is the way to say it."""
    with pytest.raises(ConfigError, match="requests in flight"):
        Tier("t", [Limit.concurrency(5)])


async def test_resolver_naming_unknown_tier_at_run_time_uses_default(
    clock: FakeClock, memory: MemoryStorage, caplog: pytest.LogCaptureFixture,
) -> None:
    """A resolver answer that names no tier falls back to the default, logged once."""
    app = make_app(tiers=[Tier("free", "1/minute"), PRO], storage=memory, clock=clock,
                   tier_resolver=lambda scope: "platinum")
    async with client_for(app) as client:
        codes = [(await client.get("/")).status_code for _ in range(3)]
    assert codes == [200, 429, 429]
    assert caplog.text.count("unknown tier 'platinum'") == 1

"""Overrides applied in one process: tiers, custom limits, blocks, expiry, the quota report."""

from __future__ import annotations

import httpx
import pytest
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from ratelimit_mw import RateLimitMiddleware, RateLimitSettings, Tier, TierByAPIKey
from ratelimit_mw.errors import ConfigError
from ratelimit_mw.overrides import Override, OverrideError, Overrides, admin_router, caller_key
from ratelimit_mw.quota import quota_router
from tests.conftest import FakeClock

TOKEN = "test-admin-token-0123456789"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


async def _ok(request: object) -> PlainTextResponse:
    return PlainTextResponse("ok")


def make_app(clock: FakeClock) -> tuple[Starlette, Overrides]:
    overrides = Overrides(clock=clock)
    app = Starlette(routes=[Route("/", _ok), *quota_router().routes,
                            *admin_router(token=TOKEN).routes])
    app.add_middleware(
        RateLimitMiddleware, key="api_key", clock=clock, overrides=overrides,
        tiers=[Tier("free", "2/minute"), Tier("pro", "5/minute")],
        tier_resolver=TierByAPIKey({"k-pro": "pro"}),
        settings=RateLimitSettings(
            exempt_paths=["/admin/ratelimit/{rest:path}", "/api/v1/account/quota"]))
    return app, overrides


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


async def _admitted(client: httpx.AsyncClient, key: str, tries: int = 10) -> int:
    """How many of ``tries`` requests of ``key`` are admitted."""
    codes = [(await client.get("/", headers={"x-api-key": key})).status_code
             for _ in range(tries)]
    return codes.count(200)


async def test_custom_limits_apply_and_expire(clock: FakeClock) -> None:
    """Custom limits replace the tier until the override expires."""
    app, overrides = make_app(clock)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://t") as c:
        await overrides.set(Override(caller_key("api_key:acme"), limits="7/minute",
                                     plan="acme", expires_at=clock() + 120))
        response = await c.get("/", headers={"x-api-key": "acme"})
        assert response.headers["x-ratelimit-limit"] == "7"
        assert await _admitted(c, "acme") == 6
        quota = (await c.get("/api/v1/account/quota", headers={"x-api-key": "acme"})).json()
        assert quota["plan"] == "acme"
        assert quota["limits"] == {"requests_per_minute": 7}
        clock.advance(121)  # expired: back on the free tier (2/minute)
        assert await _admitted(c, "acme") == 2
        quota = (await c.get("/api/v1/account/quota", headers={"x-api-key": "acme"})).json()
        assert quota["plan"] == "free"


async def test_tier_override(clock: FakeClock) -> None:
    """An override to another tier counts the caller on that tier's limits."""
    app, overrides = make_app(clock)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://t") as c:
        await overrides.set(Override(caller_key("api_key:someone"), tier="pro"))
        assert await _admitted(c, "someone") == 5


async def test_block_answers_429_until_its_end(clock: FakeClock) -> None:
    """A block answers 429 with Retry-After to its end, then lets the caller back."""
    app, overrides = make_app(clock)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://t") as c:
        await overrides.set(Override(caller_key("api_key:bad"), blocked_until=clock() + 90.5))
        response = await c.get("/", headers={"x-api-key": "bad"})
        assert response.status_code == 429
        assert response.headers["retry-after"] == "91"
        assert response.json()["error"] == "blocked"
        assert response.headers["x-ratelimit-remaining"] == "0"
        clock.advance(91)
        assert (await c.get("/", headers={"x-api-key": "bad"})).status_code == 200


async def test_network_block_matches_addresses_inside(clock: FakeClock) -> None:
    """A network override applies to every client IP inside it, and only those."""
    app, overrides = make_app(clock)
    await overrides.set(Override(caller_key("network:10.1.0.0/16"), blocked_until=clock() + 60))
    inside = httpx.ASGITransport(app, client=("10.1.2.3", 1234))
    outside = httpx.ASGITransport(app, client=("10.2.0.1", 1234))
    async with httpx.AsyncClient(transport=inside, base_url="http://t") as c:
        assert (await c.get("/")).status_code == 429
    async with httpx.AsyncClient(transport=outside, base_url="http://t") as c:
        assert (await c.get("/")).status_code == 200


async def test_delete_returns_the_caller_to_its_tier(clock: FakeClock) -> None:
    """Deleting an override applies at once."""
    app, overrides = make_app(clock)
    key = caller_key("api_key:bad")
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://t") as c:
        await overrides.set(Override(key, blocked_until=clock() + 60))
        assert (await c.get("/", headers={"x-api-key": "bad"})).status_code == 429
        assert await overrides.delete(key) is not None
        assert (await c.get("/", headers={"x-api-key": "bad"})).status_code == 200


@pytest.mark.parametrize(("fields", "field"), [
    ({"tier": "pro", "blocked_until": 2e9}, "override"),
    ({}, "override"),
    ({"limits": "0/minute"}, "limits"),
    ({"limits": "5/minute", "concurrency": 0}, "concurrency"),
    ({"blocked_until": -5}, "blocked_until"),
])
def test_bad_overrides_name_the_field(fields: dict[str, object], field: str) -> None:
    """An override that can't apply is refused with the field named."""
    with pytest.raises(OverrideError) as info:
        Override("apikey:x", **fields)  # type: ignore[arg-type]
    assert info.value.field == field


async def test_unknown_tier_and_past_expiry_are_refused(clock: FakeClock) -> None:
    """set() refuses a tier the middleware lacks, and an expiry already past."""
    _, overrides = make_app(clock)
    from ratelimit_mw.tiers import TierTable
    overrides.attach(TierTable([Tier("free", "2/minute")]))
    with pytest.raises(OverrideError, match="tier"):
        await overrides.set(Override("apikey:x", tier="gold"))
    with pytest.raises(OverrideError, match="expires_at"):
        await overrides.set(Override("apikey:x", tier="free", expires_at=clock() - 1))


def test_the_admin_router_refuses_to_mount_without_token(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without RATELIMIT_ADMIN_TOKEN the admin API is not made."""
    monkeypatch.delenv("RATELIMIT_ADMIN_TOKEN", raising=False)
    with pytest.raises(ConfigError, match="RATELIMIT_ADMIN_TOKEN"):
        admin_router()
    with pytest.raises(ConfigError, match="at least 16"):
        admin_router(token="short")


async def test_block_of_a_tier_without_limits_and_a_custom_429(clock: FakeClock) -> None:
    """A caller on a tier without rate limits is blocked too, and an app's on_denied
    hook answers the block."""
    seen: list[str] = []

    def on_denied(scope: object, denial: object) -> PlainTextResponse:
        seen.append(getattr(denial, "tier", ""))
        return PlainTextResponse("go away", status_code=429)

    overrides = Overrides(clock=clock)
    app = Starlette(routes=[Route("/", _ok)])
    app.add_middleware(RateLimitMiddleware, key="api_key", clock=clock, overrides=overrides,
                       tiers=[Tier("unlimited", [])], on_denied=on_denied,
                       settings=RateLimitSettings(header_style="legacy+draft-11"))
    await overrides.set(Override(caller_key("api_key:x"), blocked_until=clock() + 10))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://t") as c:
        response = await c.get("/", headers={"x-api-key": "x"})
    assert response.status_code == 429
    assert response.text == "go away"
    assert response.headers["retry-after"] == "10"
    assert seen == ["unlimited"]


async def test_the_429_body_and_the_metrics_hook_show_the_override(clock: FakeClock) -> None:
    """A caller over its custom limit is told that limit, and the decision hook sees the
    override's plan as its tier."""
    events: list[tuple[str, bool]] = []
    overrides = Overrides(clock=clock)
    app = Starlette(routes=[Route("/", _ok)])
    app.add_middleware(RateLimitMiddleware, key="api_key", clock=clock, overrides=overrides,
                       tiers=[Tier("free", "2/minute")],
                       on_decision=lambda event: events.append((event.tier, event.refused)))
    await overrides.set(Override(caller_key("api_key:acme"), limits="3/minute", plan="acme"))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://t") as c:
        codes = [(await c.get("/", headers={"x-api-key": "acme"})).status_code for _ in range(3)]
        denied = await c.get("/", headers={"x-api-key": "acme"})
    assert codes == [200, 200, 200]
    assert denied.status_code == 429
    assert denied.json()["limit"] == 3
    assert "3 requests per minute" in denied.json()["message"]
    assert events == [("acme", False)] * 3 + [("acme", True)]

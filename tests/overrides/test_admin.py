"""The admin API through a real app: the token, each endpoint, and hostile bodies."""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator

import httpx
import pytest
from fastapi import FastAPI
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ratelimit_mw import RateLimitMiddleware, RateLimitSettings, Tier
from ratelimit_mw.overrides import Overrides, admin_router, caller_key
from tests.conftest import FakeClock

TOKEN = "test-admin-token-0123456789"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
PATH = "/admin/ratelimit/overrides"


def make_app(clock: FakeClock) -> FastAPI:
    app = FastAPI()

    @app.get("/")
    async def root() -> dict[str, str]:
        return {"ok": "yes"}

    app.include_router(admin_router(token=TOKEN))
    app.add_middleware(RateLimitMiddleware, key="api_key", clock=clock,  # type: ignore[arg-type]
                       overrides=Overrides(clock=clock),
                       tiers=[Tier("free", "2/minute"), Tier("pro", "5/minute")],
                       settings=RateLimitSettings(exempt_paths=["/admin/ratelimit/{rest:path}"]))
    return app


@pytest.fixture
async def client() -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(make_app(FakeClock()))
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as made:
        yield made


@pytest.mark.parametrize("headers", [
    {}, {"Authorization": "Bearer wrong-token-0123456789"}, {"Authorization": TOKEN},
    {"Authorization": f"Basic {TOKEN}"}, {"Authorization": f"Bearer {TOKEN}x"},
])
async def test_missing_or_wrong_token_is_401(client: httpx.AsyncClient,
                                             headers: dict[str, str]) -> None:
    """Every endpoint refuses a request without the right bearer token."""
    for method, url in [("GET", PATH), ("PUT", PATH), ("GET", f"{PATH}/ip:1.2.3.4"),
                        ("DELETE", f"{PATH}/ip:1.2.3.4"),
                        ("POST", "/admin/ratelimit/counters/ip:1.2.3.4/reset")]:
        response = await client.request(method, url, headers=headers, json={"caller": "ip:1.1.1.1"})
        assert response.status_code == 401, (method, url)
        assert response.headers["www-authenticate"].startswith("Bearer")


async def test_set_get_list_delete(client: httpx.AsyncClient,
                                   caplog: pytest.LogCaptureFixture) -> None:
    """An override set through the API is listed, read, applied, and deleted; each
    change is one structured log line."""
    caplog.set_level(logging.INFO, "ratelimit_mw")
    body = {"caller": "api_key:acme", "limits": [{"rate": "3/minute", "algorithm": "gcra",
                                                 "burst": 4, "name": "acme"}],
            "plan": "acme", "expires_in": 3600, "reason": "contract 42"}
    response = await client.put(PATH, json=body, headers={**AUTH, "X-Admin-User": "ops"})
    assert response.status_code == 200, response.text
    stored = response.json()["override"]
    assert stored["caller"] == caller_key("api_key:acme")
    assert stored["set_by"].startswith("ops@")
    assert response.json()["replaced"] is None
    listed = (await client.get(PATH, headers=AUTH)).json()["overrides"]
    assert [o["caller"] for o in listed] == [stored["caller"]]
    assert (await client.get(f"{PATH}/api_key:acme", headers=AUTH)).json() == stored
    assert (await client.get(f"{PATH}/key:{stored['caller']}", headers=AUTH)).json() == stored
    limited = await client.get("/", headers={"x-api-key": "acme"})
    assert limited.headers["x-ratelimit-limit"] == "4"
    deleted = await client.delete(f"{PATH}/api_key:acme", headers=AUTH)
    assert deleted.json()["deleted"] == stored
    assert (await client.get(f"{PATH}/api_key:acme", headers=AUTH)).status_code == 404
    lines = [r for r in caplog.records if getattr(r, "ratelimit", {}).get("event", "")
             .startswith("override_")]
    assert [r.ratelimit["event"] for r in lines] == ["override_set", "override_delete"]  # type: ignore[attr-defined]
    first = lines[0].ratelimit  # type: ignore[attr-defined]
    assert first["who"].startswith("ops@") and first["before"] is None
    assert first["after"]["plan"] == "acme"


async def test_block_and_reset_counters(client: httpx.AsyncClient) -> None:
    """A block through the API answers 429; a counter reset gives the quota back."""
    assert [(await client.get("/", headers={"x-api-key": "k"})).status_code
            for _ in range(3)] == [200, 200, 429]
    reset = await client.post("/admin/ratelimit/counters/api_key:k/reset", headers=AUTH)
    assert reset.status_code == 200
    assert (await client.get("/", headers={"x-api-key": "k"})).status_code == 200
    response = await client.put(PATH, json={"caller": "api_key:k", "block_for": 30},
                                headers=AUTH)
    assert response.status_code == 200
    blocked = await client.get("/", headers={"x-api-key": "k"})
    assert blocked.status_code == 429 and blocked.headers["retry-after"] == "30"
    listed = (await client.get(f"{PATH}?blocked=true", headers=AUTH)).json()["overrides"]
    assert len(listed) == 1


@pytest.mark.parametrize(("body", "field"), [
    ({"caller": "api_key:a", "limits": [{"rate": "5/minute", "algorithm": "magic"}]},
     "limits[0]"),
    ({"caller": "api_key:a", "limits": "0/minute"}, "limits"),
    ({"caller": "api_key:a", "limits": [{"rate": "5/minute", "algorithm": "token_bucket",
                                         "burst": 0}]}, "limits[0]"),
    ({"caller": "api_key:a", "tier": "pro", "expires_at": "2001-01-01T00:00:00Z"}, "expires_at"),
    ({"caller": "api_key:a", "tier": "gold"}, "tier"),
    ({"caller": "api_key:" + "x" * 300, "tier": "pro"}, "caller"),
    ({"caller": "ip:not-an-ip", "tier": "pro"}, "caller"),
    ({"caller": "api_key:a"}, "override"),
    ({"tier": "pro"}, "caller"),
    ({"caller": "api_key:a", "tier": "pro", "colour": "red"}, "colour"),
    ({"caller": "api_key:a", "block_for": -1}, "block_for"),
    ([1, 2], "body"),
])
async def test_bad_bodies_are_422_naming_the_field(client: httpx.AsyncClient, body: object,
                                                    field: str) -> None:
    """Bad input is a 422 whose body names the bad field."""
    response = await client.put(PATH, json=body, headers=AUTH)
    assert response.status_code == 422, response.text
    assert response.json()["field"] == field


async def test_malformed_json_is_422(client: httpx.AsyncClient) -> None:
    """A body that is not JSON is a 422, not a 500."""
    response = await client.put(PATH, content=b"{not json", headers=AUTH)
    assert response.status_code == 422
    assert response.json()["field"] == "body"


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=30),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner,
                                                                max_size=4),
    max_leaves=12)
_field_values = st.fixed_dictionaries({}, optional={
    "caller": st.sampled_from(["api_key:a", "ip:1.2.3.4", "network:10.0.0.0/8", "user:u"])
    | _json,
    "tier": st.sampled_from(["free", "pro", "gold"]) | _json,
    "limits": st.sampled_from(["5/minute", "0/second", [{"rate": "1/day", "algorithm": "gcra",
                                                          "burst": 3}]]) | _json,
    "concurrency": _json, "plan": _json, "blocked_until": _json, "block_for": _json,
    "expires_at": _json, "expires_in": _json, "reason": _json,
})


@settings(max_examples=150, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=_field_values | _json)
async def test_no_body_causes_a_500(client: httpx.AsyncClient, body: object) -> None:
    """Whatever the body, the answer is 200 or 422, never a server error."""
    content = json.dumps(body, allow_nan=True).encode()
    response = await client.put(PATH, content=content, headers=AUTH)
    assert response.status_code in (200, 422), response.text
    if response.status_code == 422:
        assert response.json()["field"]


def _client_at(address: str) -> httpx.AsyncClient:
    transport = httpx.ASGITransport(make_app(FakeClock()), client=(address, 1))
    return httpx.AsyncClient(transport=transport, base_url="http://t")


async def test_failed_authentications_are_limited_per_address_and_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """40 calls with wrong tokens from one address: the first 10 get 401 and are logged
    with the address; the rest get 429 (with Retry-After) without their token being
    looked at; a right token from another address still gets in."""
    app = make_app(FakeClock())
    wrong = {"Authorization": "Bearer wrong-token-0123456789"}
    transport = httpx.ASGITransport(app, client=("198.51.100.7", 1))
    other = httpx.ASGITransport(app, client=("203.0.113.50", 1))
    with caplog.at_level(logging.WARNING, logger="ratelimit_mw.admin"):
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client, \
                httpx.AsyncClient(transport=other, base_url="http://t") as elsewhere:
            codes = [(await client.get(PATH, headers=wrong)).status_code for _ in range(40)]
            refused = await client.get(PATH, headers=wrong)
            right_there = await elsewhere.get(PATH, headers=AUTH)
            right_here = await client.get(PATH, headers=AUTH)
    assert codes == [401] * 10 + [429] * 30
    assert int(refused.headers["retry-after"]) >= 1
    assert refused.json()["error"] == "too_many_failed_authentications"
    assert right_there.status_code == 200
    assert right_here.status_code == 429  # its own address's failures, not another's
    logged = [r for r in caplog.records if "bad or missing token" in r.getMessage()]
    assert len(logged) == 10
    assert all("198.51.100.7" in r.getMessage() for r in logged)


async def test_a_right_token_counts_no_failure() -> None:
    """Right tokens take their reserved failure back: after 30 of them, an address may
    still fail 10 times before it is refused."""
    wrong = {"Authorization": "Bearer wrong-token-0123456789"}
    async with _client_at("198.51.100.8") as client:
        for _ in range(30):
            assert (await client.get(PATH, headers=AUTH)).status_code == 200
        codes = [(await client.get(PATH, headers=wrong)).status_code for _ in range(11)]
    assert codes == [401] * 10 + [429]

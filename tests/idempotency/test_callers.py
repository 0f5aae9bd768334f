"""Whose records a keyed request may replay: the same caller, sending the same credentials.

Two callers behind one IP (an office NAT, a proxy not in ``trusted_proxies``) that
send the same key and body must each get their own run: a replay of another caller's
response would hand over their order, their ``Location``, their data.
"""

from __future__ import annotations

from typing import Any

import pytest

from ratelimit_mw import Tier

from .conftest import Harness

BODY = b'{"item": "book"}'
KEY = {"Idempotency-Key": "k1"}

PAIRS = {
    "bearer tokens": ({"Authorization": "Bearer token-alice"},
                      {"Authorization": "Bearer token-bob"}),
    "basic credentials": ({"Authorization": "Basic YWxpY2U6cHc="},
                          {"Authorization": "Basic Ym9iOnB3"}),
    "api keys": ({"X-API-Key": "key-alice"}, {"X-API-Key": "key-bob"}),
    "session cookies": ({"Cookie": "session=alice"}, {"Cookie": "session=bob"}),
    "a token and none": ({"Authorization": "Bearer token-alice"}, {}),
    "an api key, then the same with a token": (
        {"X-API-Key": "key-alice"},
        {"X-API-Key": "key-alice", "Authorization": "Bearer token-bob"}),
}
LIMITERS: dict[str, dict[str, Any] | None] = {
    "alone": None,
    "behind a limiter keyed by IP": {"tiers": [Tier("t", "1000/minute")]},
    "behind a limiter keyed by API key": {"tiers": [Tier("t", "1000/minute")],
                                          "key": "api_key"},
}


@pytest.mark.parametrize("transport", ["asgi"])
@pytest.mark.parametrize("limiter", list(LIMITERS), ids=list(LIMITERS))
@pytest.mark.parametrize("pair", list(PAIRS), ids=list(PAIRS))
async def test_callers_that_differ_in_a_credential_never_share_a_record(
    harness: Harness, pair: str, limiter: str,
) -> None:
    """From one IP, the same key and body: the second caller's request runs itself."""
    alice, bob = PAIRS[pair]
    async with harness.client(limiter=LIMITERS[limiter]) as client:
        first = await client.post("/orders", content=BODY, headers={**KEY, **alice})
        second = await client.post("/orders", content=BODY, headers={**KEY, **bob})
        again = await client.post("/orders", content=BODY, headers={**KEY, **bob})
    assert first.status_code == second.status_code == 201
    assert first.json()["order"] != second.json()["order"]
    assert "x-idempotent-replayed" not in second.headers
    assert harness.orders.runs["create"] == 2
    assert again.headers.get("x-idempotent-replayed") == "true"  # Bob's own record
    assert again.json() == second.json()


@pytest.mark.parametrize("transport", ["asgi"])
@pytest.mark.parametrize("limiter", list(LIMITERS), ids=list(LIMITERS))
@pytest.mark.parametrize("pair", list(PAIRS), ids=list(PAIRS))
async def test_the_same_caller_is_replayed(harness: Harness, pair: str, limiter: str) -> None:
    """The same credentials again (and no others): the first response, replayed."""
    alice, _ = PAIRS[pair]
    async with harness.client(limiter=LIMITERS[limiter]) as client:
        first = await client.post("/orders", content=BODY, headers={**KEY, **alice})
        second = await client.post("/orders", content=BODY, headers={**KEY, **alice})
    assert second.headers.get("x-idempotent-replayed") == "true"
    assert second.json() == first.json()
    assert harness.orders.runs["create"] == 1


async def test_alice_and_bob_behind_one_nat_under_uvicorn(harness: Harness) -> None:
    """The report's case, over a real socket: Bob's order is created, and Alice's
    response is not his."""
    limiter = {"tiers": [Tier("t", "1000/minute")]}
    async with harness.client(limiter=limiter) as client:
        alice = await client.post("/orders", content=BODY, headers={
            **KEY, "Authorization": "Bearer token-alice"})
        bob = await client.post("/orders", content=BODY, headers={
            **KEY, "Authorization": "Bearer token-bob"})
    assert (alice.json()["order"], bob.json()["order"]) == (1, 2)
    assert bob.headers["x-order"] == "2"
    assert "x-idempotent-replayed" not in bob.headers


@pytest.mark.parametrize("transport", ["asgi"])
async def test_records_follow_the_caller_the_limiter_resolved(harness: Harness) -> None:
    """Behind a limiter whose key function tells tenants apart, the same credentials
    from two tenants are two callers."""
    def tenant(scope: Any) -> str:
        return dict(scope["headers"]).get(b"x-tenant", b"-").decode()

    limiter = {"tiers": [Tier("t", "1000/minute")], "key": tenant}
    token = {"Authorization": "Bearer shared"}
    async with harness.client(limiter=limiter) as client:
        first = await client.post("/orders", content=BODY,
                                  headers={**KEY, **token, "X-Tenant": "a"})
        other = await client.post("/orders", content=BODY,
                                  headers={**KEY, **token, "X-Tenant": "b"})
        same = await client.post("/orders", content=BODY,
                                 headers={**KEY, **token, "X-Tenant": "a"})
    assert "x-idempotent-replayed" not in other.headers
    assert same.headers.get("x-idempotent-replayed") == "true"
    assert same.json() == first.json()
    assert harness.orders.runs["create"] == 2

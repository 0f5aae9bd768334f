"""The example app's admin API over real HTTP: the session docs/overrides.md shows."""

from __future__ import annotations

import httpx
import pytest

from .conftest import ENTERPRISE, FREE, StartServer

pytestmark = pytest.mark.slow

TOKEN = "example-admin-token-0123456789"
ADMIN = {"Authorization": f"Bearer {TOKEN}"}


async def test_admin_session(start_server: StartServer, kind: str) -> None:
    """Block a key, see it refused, lift the block, reset its counters; the admin API
    wants the token, and enterprise carries its start-up override."""
    server = start_server(kind, admin_token=TOKEN)
    overrides = f"{server.url}/admin/ratelimit/overrides"
    async with httpx.AsyncClient() as client:
        assert (await client.get(overrides)).status_code == 401
        listed = (await client.get(overrides, headers=ADMIN)).json()["overrides"]
        assert [o["plan"] for o in listed] == ["enterprise"]
        hello = await client.get(f"{server.url}/api/v1/hello", headers=ENTERPRISE)
        assert hello.headers["x-ratelimit-limit"] == "10000"
        put = await client.put(overrides, headers=ADMIN, json={
            "caller": "api_key:demo-free", "block_for": 120, "reason": "abuse"})
        assert put.status_code == 200
        blocked = await client.get(f"{server.url}/api/v1/hello", headers=FREE)
        assert blocked.status_code == 429
        assert blocked.headers["retry-after"] in ("119", "120")
        assert blocked.json()["error"] == "blocked"
        gone = await client.delete(f"{overrides}/api_key:demo-free", headers=ADMIN)
        assert gone.status_code == 200
        for _ in range(20):
            await client.get(f"{server.url}/api/v1/hello", headers=FREE)
        assert (await client.get(f"{server.url}/api/v1/hello", headers=FREE)).status_code == 429
        reset = await client.post(
            f"{server.url}/admin/ratelimit/counters/api_key:demo-free/reset", headers=ADMIN)
        assert reset.status_code == 200
        assert (await client.get(f"{server.url}/api/v1/hello", headers=FREE)).status_code == 200


async def test_without_a_token_the_admin_api_is_not_mounted(start_server: StartServer) -> None:
    """No RATELIMIT_ADMIN_TOKEN: the admin paths do not exist."""
    server = start_server("memory")
    response = httpx.get(f"{server.url}/admin/ratelimit/overrides", headers=ADMIN)
    assert response.status_code == 404

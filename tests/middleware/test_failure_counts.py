"""Fail-open is visible: every decision made without the storage is counted by cause
(timeout, connection, breaker open), and each outage is logged twice, not per request:
when it begins (the error) and when it ends (how many decisions, by cause)."""

from __future__ import annotations

import asyncio
import logging
import uuid
from typing import Any

import pytest
from starlette.applications import Starlette
from starlette.routing import Route

from ratelimit_mw.middleware import RateLimitMiddleware
from ratelimit_mw.settings import RateLimitSettings
from ratelimit_mw.tiers import Tier
from tests.middleware.conftest import RedisServer, client_for, ok
from tests.redis_servers import delayed

pytestmark = pytest.mark.redis


def _app(url: str, **options: Any) -> RateLimitMiddleware:
    options = {"storage_connect_timeout": 0.05, **options}
    return RateLimitMiddleware(
        Starlette(routes=[Route("/", ok)]), tiers=[Tier("t", "1000/minute")],
        settings=RateLimitSettings(
            storage_url=url, storage_prefix=f"rlcount:{uuid.uuid4().hex[:12]}:",
            storage_timeout=0.05, recovery_interval=0.2, **options))


def _events(caplog: pytest.LogCaptureFixture, name: str) -> list[logging.LogRecord]:
    return [record for record in caplog.records
            if getattr(record, "ratelimit", {}).get("event") == name]


async def test_an_outage_is_counted_by_cause_and_logged_once_each_way(
    redis_server: RedisServer, caplog: pytest.LogCaptureFixture,
) -> None:
    """Redis killed: refused connections, then the breaker; 20 requests, one line when
    it begins and one with the counts when Redis answers again."""
    caplog.set_level(logging.WARNING, logger="ratelimit_mw")
    app = _app(redis_server.url)
    async with client_for(app) as client:
        assert (await client.get("/")).status_code == 200
        redis_server.stop()
        for _ in range(20):
            assert (await client.get("/")).status_code == 200
        stats = app.failure_stats
        assert stats.connection_errors >= 2  # the breaker opens after a few
        assert stats.skipped >= 1
        assert stats.timeouts == stats.other_errors == 0
        assert stats.without_storage == stats.connection_errors + stats.skipped == 20
        assert stats.allowed == 20
        assert len(_events(caplog, "storage_failure")) == 1
        assert not _events(caplog, "storage_recovered")

        redis_server.start()
        for _ in range(100):
            await asyncio.sleep(0.05)
            await client.get("/")
            if _events(caplog, "storage_recovered"):
                break
        [recovered] = _events(caplog, "storage_recovered")
        assert recovered.ratelimit["without_storage"] == app.failure_stats.without_storage  # type: ignore[attr-defined]
        assert f"connection={app.failure_stats.connection_errors}" in recovered.getMessage()
        assert app.failure_stats.episodes == 1
    await app.storage.close()


async def test_a_slow_storage_counts_timeouts(redis_url: str) -> None:
    """Answers slower than the per-decision timeout are counted as timeouts."""
    async with delayed(redis_url, 0.1) as slow_url:
        app = _app(slow_url, storage_connect_timeout=5)
        await app.storage.prepare()  # connected, so the per-decision timeout applies
        async with client_for(app) as client:
            for _ in range(3):
                assert (await client.get("/")).status_code == 200
        assert app.failure_stats.timeouts == 3
        assert app.failure_stats.connection_errors == 0
        await app.storage.close()

"""Settling when things go wrong, over a real uvicorn: a client that cuts a stream short,
and a Redis that dies between the reservation and the settlement."""

from __future__ import annotations

import asyncio
import logging
import threading

import httpx
import pytest

from ratelimit_mw.metrics import PrometheusMetrics
from tests.servers import serve

from .conftest import RedisServer, token_stream_app

pytestmark = [pytest.mark.slow, pytest.mark.redis]

@pytest.mark.parametrize("kind", ["memory", "redis"])
async def test_a_stream_cut_short_still_settles_what_it_used(
    kind: str, redis_url: str, redis_prefix: str,
) -> None:
    """The client leaves after the first event. What the stream had reported by the
    time it ended settles: 400 tokens if the server stopped it then (Starlette stops a
    stream whose client left), 450 if it ran to its end; never the estimate of 100."""
    gate = threading.Event()
    options = {} if kind == "memory" else {"storage_url": redis_url,
                                           "storage_prefix": redis_prefix}
    with serve(token_stream_app(400, 450, gate, storage_timeout=2.0, **options)) as url:
        async with (httpx.AsyncClient(base_url=url, timeout=5) as client,
                    client.stream("GET", "/stream") as response):
            async for chunk in response.aiter_bytes():
                assert chunk.startswith(b"data: first")
                break  # and close the connection
        gate.set()
        async with httpx.AsyncClient(base_url=url, timeout=5) as client:
            for _ in range(100):
                after = await client.get("/quiet")
                if int(after.headers["x-ratelimit-remaining-tokens"]) < 700:
                    break  # settled (the estimate alone would leave 800)
                await asyncio.sleep(0.02)
    # 1000 less 400 or 450 less /quiet's own 100, and what refilled (17 a second).
    assert 450 <= int(after.headers["x-ratelimit-remaining-tokens"]) <= 560


async def test_a_settlement_lost_to_an_outage_is_counted_and_logged(
    redis_server: RedisServer, caplog: pytest.LogCaptureFixture,
) -> None:
    """Redis dies while the stream runs: the settlement fails, is logged and counted
    (the reservation, had Redis kept it, would stand); the client gets its whole
    response."""
    gate = threading.Event()
    metrics = PrometheusMetrics()
    app = token_stream_app(400, 450, gate, storage_timeout=2.0,
                           storage_url=redis_server.url, metrics=metrics)
    with serve(app) as url, caplog.at_level(logging.WARNING, logger="ratelimit_mw"):
        async with httpx.AsyncClient(base_url=url, timeout=10) as client:
            async with client.stream("GET", "/stream") as response:
                chunks = response.aiter_bytes()
                assert (await chunks.__anext__()).startswith(b"data: first")
                redis_server.stop()  # between the reservation and the settlement
                gate.set()
                rest = b"".join([chunk async for chunk in chunks])
            assert response.status_code == 200
            assert b"total_tokens" in rest
        for _ in range(200):
            if metrics.registry.get_sample_value("ratelimit_settlement_failures_total") == 1:
                break
            await asyncio.sleep(0.02)
    assert metrics.registry.get_sample_value("ratelimit_settlement_failures_total") == 1
    assert any("settlement failed: event=settlement_failed" in r.getMessage()
               for r in caplog.records)  # the first of the outage (outages.OutageLog)

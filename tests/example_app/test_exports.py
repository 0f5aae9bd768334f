"""The example's shaped export route over real HTTP, on two uvicorn workers sharing
Redis: a burst comes out at the configured rate, the excess is refused at once, and
nothing is held past ``max_delay``."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest

from .conftest import PRO, StartServer

pytestmark = [pytest.mark.slow, pytest.mark.redis]

SPACING = 0.5  # 2/second
MAX_DELAY = 5.0


async def test_a_burst_of_exports_comes_out_of_two_workers_at_the_rate(
    start_server: StartServer,
) -> None:
    """Twelve at once: eleven turns fit within 5 s (0, 0.5 … 5 s), the twelfth is
    refused at once; the admitted ones finish spaced by the rate, across both workers,
    none held past 5 s."""
    server = start_server("redis", workers=2)
    # Twelve keep-alive connections, at least three to each worker (the kernel hands
    # new connections to whichever worker accepts first, often one far more than the
    # other), then the burst over them.
    by_worker: dict[int, list[httpx.AsyncClient]] = {}
    try:
        for _ in range(300):
            client = httpx.AsyncClient(base_url=server.url, headers=PRO, timeout=30)
            worker = (await client.get("/api/v1/hello")).json()["worker"]
            held = by_worker.setdefault(worker, [])
            if len(held) < 9:
                held.append(client)
            else:
                await client.aclose()
            if sum(len(c) for c in by_worker.values()) == 12:
                break
        clients = [client for held in by_worker.values() for client in held]
        assert len(by_worker) == 2 and len(clients) == 12, {w: len(c) for w, c in
                                                            by_worker.items()}

        async def export(client: httpx.AsyncClient) -> tuple[httpx.Response, float]:
            response = await client.post("/api/v1/exports")
            return response, time.monotonic()

        started = time.monotonic()
        results = await asyncio.gather(*(export(client) for client in clients))
    finally:
        for client in (c for held in by_worker.values() for c in held):
            await client.aclose()
    workers = {response.json()["worker"] for response, _ in results
               if response.status_code == 202}
    assert len(workers) == 2
    admitted = sorted(done - started for response, done in results
                      if response.status_code == 202)
    refused = [done - started for response, done in results if response.status_code == 429]
    assert len(admitted) == 11 and len(refused) == 1
    assert refused[0] < admitted[1]  # refused before the second turn came
    # Each finishes at its turn: never early (the turns start no sooner than the burst),
    # late only by what a loaded host adds (counted from the first, which a loaded host
    # may answer late too).
    for i, at in enumerate(admitted):
        assert i * SPACING - 0.05 <= at, admitted
        assert at - admitted[0] <= i * SPACING + 0.3, admitted
    waits = [int(response.headers["server-timing"].removeprefix("ratelimit;dur="))
             for response, _ in results if "server-timing" in response.headers]
    assert max(waits) <= MAX_DELAY * 1000 + 50

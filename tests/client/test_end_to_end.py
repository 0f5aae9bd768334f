"""The retrying client against this project's own middleware, under a real uvicorn.

Both sides share one fake clock: the client's waits move the server's time, so the
test runs in real milliseconds while 30 calls at 10/minute take minutes of its time.
"""

from __future__ import annotations

import itertools
import threading

import httpx
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ratelimit_mw import Limit, MemoryStorage, RateLimitMiddleware, Tier
from ratelimit_mw.client import RetryPolicy, RetryTransport
from tests.conftest import FakeClock
from tests.servers import serve


class Timeline:
    """What the server saw: when each request arrived and what it answered."""

    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock
        self.lock = threading.Lock()
        self.events: list[tuple[float, int, int | None]] = []

    def app(self) -> ASGIApp:
        async def hello(request: Request) -> Response:
            return JSONResponse({"hello": "world"})

        app = Starlette(routes=[Route("/hello", hello)])
        app.add_middleware(
            RateLimitMiddleware,
            tiers=[Tier("t", [Limit("10/minute", "token_bucket", burst=5, name="b")])],
            storage=MemoryStorage(clock=self.clock), clock=self.clock,
        )

        async def recording(scope: Scope, receive: Receive, send: Send) -> None:
            arrived = self.clock()

            async def watch(message: Message) -> None:
                if message["type"] == "http.response.start":
                    headers = dict(message.get("headers", []))
                    retry = headers.get(b"retry-after")
                    with self.lock:
                        self.events.append((arrived, message["status"],
                                            int(retry) if retry is not None else None))
                await send(message)

            await app(scope, receive, watch)

        return recording


async def test_thirty_calls_at_ten_per_minute_burst_five_see_no_429() -> None:
    """30 calls against 10/minute burst 5: no 429 reaches the caller, and no retry
    arrives before the Retry-After it was given."""
    clock = FakeClock(1_800_000_000.0)
    timeline = Timeline(clock)
    waits: list[float] = []

    async def fake_sleep(seconds: float) -> None:
        waits.append(seconds)
        clock.advance(seconds)

    transport = RetryTransport(
        policy=RetryPolicy(max_retries=5, max_time=600.0),
        clock=clock, wall_clock=clock, async_sleep=fake_sleep,
    )
    with serve(timeline.app()) as url:
        async with httpx.AsyncClient(transport=transport, base_url=url) as client:
            statuses = [(await client.get("/hello")).status_code for _ in range(30)]

    assert statuses == [200] * 30
    denials = [(t, retry) for t, status, retry in timeline.events if status == 429]
    admitted = [t for t, status, _ in timeline.events if status == 200]
    assert len(admitted) == 30
    assert len(denials) == 25  # every call after the burst of 5 was told to wait once
    events = timeline.events
    for (at, status, retry_after), (next_at, _, _) in itertools.pairwise(events):
        if status == 429:  # the client is sequential: the next request is its retry
            assert retry_after is not None and next_at >= at + retry_after
    # The sustained pace: 25 calls after the burst at 10/minute take about 150 s.
    assert 140 <= clock.now - 1_800_000_000.0 <= 160
    assert all(w >= 1 for w in waits)

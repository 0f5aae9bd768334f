"""The leaky bucket as a queue, over a real uvicorn on memory and on Redis: requests
admitted for a turn ahead are held until it, spaced by the rate; past ``max_delay`` or
the worker's cap they are refused at once, and what they were charged is given back."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route

from ratelimit_mw import Limit, RateLimitSettings, Tier, limit
from ratelimit_mw.metrics import PrometheusMetrics
from tests.servers import serve

from .conftest import make_app

pytestmark = pytest.mark.slow

SHAPED = Limit("5/second", "leaky_bucket", max_delay=2, name="exports")
"""A turn every 0.2 s; a request may wait up to 2 s for its turn."""
SPACING = 0.2
EARLY = 0.02  # seconds a request may enter before its turn (the clocks' resolution)
LATE = 0.25  # seconds it may enter after (a loaded two-core host)


@pytest.fixture(params=["memory", pytest.param("redis", marks=pytest.mark.redis)])
def storage_options(request: pytest.FixtureRequest) -> dict[str, Any]:
    """Settings for the app's own storage: memory, or the test's Redis."""
    if request.param == "memory":
        return {}
    return {"storage_url": request.getfixturevalue("redis_url"),
            "storage_prefix": request.getfixturevalue("redis_prefix"), "storage_timeout": 5.0}


def shaped_app(entered: list[float], *, seconds: float = 0.0, tiers: list[Tier] | None = None,
               **options: Any) -> Any:
    """``POST /export``, shaped by ``SHAPED``: notes when each request enters."""
    @limit(SHAPED)
    async def export(request: Request) -> Response:
        entered.append(time.monotonic())
        if seconds:
            await asyncio.sleep(seconds)
        return PlainTextResponse("exported")

    return make_app([Route("/export", export, methods=["POST"])],
                    tiers=tiers or [Tier("t", "1000/minute")], **options)


@pytest.fixture
def served() -> Iterator[Any]:
    """``served(app)``: its base URL while the test runs."""
    stack: list[Any] = []

    def start(app: Any) -> str:
        context = serve(app)
        stack.append(context)
        return str(context.__enter__())

    yield start
    for context in reversed(stack):
        context.__exit__(None, None, None)


def held_ms(response: httpx.Response) -> int:
    """How long the middleware held ``response``'s request (its ``Server-Timing``), in
    milliseconds; 0 when it was not held."""
    timing = response.headers.get("server-timing", "ratelimit;dur=0")
    return int(timing.removeprefix("ratelimit;dur="))


async def burst(url: str, n: int, **kwargs: Any) -> list[tuple[httpx.Response, float]]:
    """``n`` POST /export at once, each on its own connection: (response, seconds)."""
    async def one() -> tuple[httpx.Response, float]:
        async with httpx.AsyncClient(base_url=url, timeout=30) as client:
            started = time.monotonic()
            response = await client.post("/export", **kwargs)
            return response, time.monotonic() - started

    return await asyncio.gather(*(one() for _ in range(n)))


async def test_a_burst_comes_out_at_the_rate(
    served: Any, storage_options: dict[str, Any],
) -> None:
    """Twelve at once: eleven have a turn within 2 s (0, 0.2 … 2.0 s) and reach the
    handler spaced by the rate, saying how long they waited; the twelfth is refused at
    once with the Retry-After of its turn."""
    entered: list[float] = []
    metrics = PrometheusMetrics()
    url = served(shaped_app(entered, metrics=metrics, **storage_options))
    results = await burst(url, 12)
    codes = sorted(response.status_code for response, _ in results)
    assert codes == [200] * 11 + [429]
    refused = next((r, s) for r, s in results if r.status_code == 429)
    assert refused[1] < 0.5  # not held
    assert int(refused[0].headers["retry-after"]) >= 1
    # Never before its turn (the rate holds); late only by what a loaded host adds.
    first = min(entered)
    offsets = [round(t - first - i * SPACING, 3) for i, t in enumerate(sorted(entered))]
    assert all(-EARLY <= offset <= LATE for offset in offsets), offsets
    waits = sorted(held_ms(r) for r, _ in results if "server-timing" in r.headers)
    assert len(waits) >= 9  # the first has no wait; the second, perhaps a few ms
    assert 2000 - 150 <= waits[-1] <= 2000 + 150
    assert metrics.registry.get_sample_value("ratelimit_hold_seconds_count",
                                             {"tier": "t"}) == len(waits)
    assert metrics.registry.get_sample_value("ratelimit_held_requests", {"tier": "t"}) == 0


async def test_past_the_cap_requests_are_refused_and_their_turns_given_back(
    served: Any, storage_options: dict[str, Any],
) -> None:
    """A worker that holds at most two: of six at once, one goes in, two are held, three
    are refused at once (their turns given back), so the schedule ends after the third
    turn: a request a little later waits no longer than that."""
    entered: list[float] = []
    metrics = PrometheusMetrics()
    url = served(shaped_app(entered, metrics=metrics, max_held_requests=2,
                            **storage_options))
    results = await burst(url, 6)
    codes = sorted(response.status_code for response, _ in results)
    assert codes == [200] * 3 + [429] * 3
    assert all(seconds < 0.5 for response, seconds in results
               if response.status_code == 429), results
    assert metrics.registry.get_sample_value("ratelimit_holds_given_up_total",
                                             {"reason": "full"}) == 3
    await asyncio.sleep(0.25)  # after the last held one went in (0.4 s)
    (later, _), = await burst(url, 1)
    assert later.status_code == 200
    # Three turns taken (0, 0.2, 0.4): the next is at 0.6, at most ~0.2 s away; had the
    # refused ones kept theirs, it would be 1.2 s.
    assert held_ms(later) < 400


async def test_a_client_that_leaves_while_held_gives_its_turn_back(
    served: Any, storage_options: dict[str, Any],
) -> None:
    """A client that gives up while held never reaches the handler; its turn goes back,
    so the next request takes it."""
    entered: list[float] = []
    metrics = PrometheusMetrics()
    url = served(shaped_app(entered, metrics=metrics, **storage_options))
    await burst(url, 1)
    async with httpx.AsyncClient(base_url=url, timeout=0.1) as impatient:
        with pytest.raises(httpx.TimeoutException):
            await impatient.post("/export")  # its turn is 0.2 s ahead
    deadline = time.monotonic() + 3
    while metrics.registry.get_sample_value("ratelimit_holds_given_up_total",
                                            {"reason": "left"}) != 1:
        assert time.monotonic() < deadline, "the server never saw the client leave"
        await asyncio.sleep(0.02)
    assert len(entered) == 1
    await asyncio.sleep(0.2)
    (after, _), = await burst(url, 1)
    assert after.status_code == 200
    assert held_ms(after) < 100


async def test_a_slot_is_taken_on_entering_not_while_held(
    served: Any, storage_options: dict[str, Any],
) -> None:
    """One concurrency slot, a handler of 0.1 s, three at once: each enters at its turn
    (0.2 s apart), when the one before has given the slot back: all pass. Slots taken
    while held would refuse two of them."""
    entered: list[float] = []
    url = served(shaped_app(entered, seconds=0.1, tiers=[Tier("t", "1000/minute",
                                                              concurrency=1)],
                            **storage_options))
    results = await burst(url, 3)
    assert [response.status_code for response, _ in results] == [200] * 3


async def test_the_daily_quota_counts_each_admitted_request_once(
    served: Any, storage_options: dict[str, Any],
) -> None:
    """A tier's daily quota beside the shaped route: eleven admitted, one refused (not
    counted), so 100 - 11 - 1 are left after one more."""
    entered: list[float] = []
    daily = Tier("t", Limit("100/day", "fixed_window", name="daily"))
    url = served(shaped_app(entered, header_style="draft-11", tiers=[daily],
                            **storage_options))
    results = await burst(url, 12)
    assert sorted(r.status_code for r, _ in results) == [200] * 11 + [429]
    await asyncio.sleep(2.2)
    (last, _), = await burst(url, 1)
    assert last.status_code == 200
    assert '"daily";r=88;' in last.headers["ratelimit"], last.headers


def test_a_bad_cap_or_delay_fails_at_start_up() -> None:
    with pytest.raises(ValueError, match="max_held_requests"):
        RateLimitSettings(max_held_requests=-1)
    with pytest.raises(ValueError, match="max_delay"):
        Limit("2/second", "leaky_bucket", max_delay="forever")

"""Fixtures for the client tests: fake clocks, a testing-mode guard, mock transports."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator

import httpx
import pytest

from ratelimit_mw.client import RetryTransport, set_testing

# Fri, 01 May 2026 12:00:00 GMT: a fixed wall clock for dates and epoch resets.
WALL_NOW = 1_777_636_800.0


class FakeClock:
    """Monotonic and wall clocks that only move when told, and sleeps that record.

    ``sleep`` and ``auto_sleep`` move time forward at once; ``parked_sleep``
    waits until a test calls :meth:`advance`, so concurrent waiters can be
    observed mid-wait.
    """

    def __init__(self) -> None:
        self.now = 1000.0
        self.wall = WALL_NOW
        self.sleeps: list[float] = []
        self._parked: list[tuple[float, asyncio.Future[None]]] = []

    def __call__(self) -> float:
        return self.now

    def wall_clock(self) -> float:
        return self.wall

    def move(self, seconds: float) -> None:
        """Move both clocks forward."""
        self.now += seconds
        self.wall += seconds

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.move(seconds)

    async def auto_sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.move(seconds)
        await asyncio.sleep(0)

    async def parked_sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._parked.append((self.now + seconds, future))
        await future

    async def advance(self, seconds: float) -> None:
        """Move time forward, wake the parked sleeps that are due, and let tasks run."""
        self.move(seconds)
        due = [future for deadline, future in self._parked if deadline <= self.now + 1e-9]
        self._parked = [(d, f) for d, f in self._parked if f not in due]
        for future in due:
            if not future.done():
                future.set_result(None)
        await settle()


async def settle() -> None:
    """Let every ready task run until the loop is idle."""
    for _ in range(20):
        await asyncio.sleep(0)


@pytest.fixture
def clock() -> FakeClock:
    """A fake clock starting at monotonic 1000 s and wall time 2026-05-01 12:00 UTC."""
    return FakeClock()


@pytest.fixture(autouse=True)
def _testing_off() -> Iterator[None]:
    """Make sure no test leaks the global testing switch into another."""
    set_testing(False)
    yield
    set_testing(False)


Handler = Callable[[httpx.Request], httpx.Response]


class Recorder:
    """A MockTransport handler that plays canned responses and remembers every request."""

    def __init__(self, *responses: httpx.Response | Exception) -> None:
        self.responses = list(responses)
        self.requests: list[httpx.Request] = []
        self.bodies: list[bytes] = []
        self.sent: list[httpx.Response] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        if isinstance(request.stream, httpx.ByteStream):
            self.bodies.append(request.read())
        answer = self.responses.pop(0) if len(self.responses) > 1 else self.responses[0]
        if isinstance(answer, Exception):
            raise answer
        # A fresh copy each time, so a repeated answer is a distinct response.
        response = httpx.Response(answer.status_code, headers=answer.headers, content=b"body")
        self.sent.append(response)
        return response

    @property
    def calls(self) -> int:
        return len(self.requests)


def retrying(recorder: Recorder, clock: FakeClock, **kwargs: object) -> RetryTransport:
    """A RetryTransport around ``recorder`` on the fake clock, with jitter fixed at 0.5."""
    options: dict[str, object] = {
        "clock": clock,
        "wall_clock": clock.wall_clock,
        "sleep": clock.sleep,
        "async_sleep": clock.auto_sleep,
        "random": lambda: 0.5,
    }
    options.update(kwargs)
    return RetryTransport(httpx.MockTransport(recorder), **options)  # type: ignore[arg-type]

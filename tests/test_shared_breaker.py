"""SharedCircuitBreaker: an opening in one process refuses calls in every other, through a
real Redis; each transition is one log line."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable

import pytest
import redis.asyncio as aioredis

from ratelimit_mw.breaker import CircuitBreaker, CircuitState
from ratelimit_mw.breaker.shared import SharedCircuitBreaker

pytestmark = pytest.mark.redis

Make = Callable[..., SharedCircuitBreaker]


@pytest.fixture
async def make(redis_url: str, redis_prefix: str) -> AsyncIterator[Make]:
    """Breakers of one name on the test's Redis, as if in separate processes; closed after."""
    made: list[SharedCircuitBreaker] = []

    def make(**options: object) -> SharedCircuitBreaker:
        options = {"name": "db", "window_size": 2, "minimum_calls": 2, "cooldown": 2.0,
                   "sync_interval": 0.01, **options}
        breaker = SharedCircuitBreaker(redis=redis_url, prefix=f"{redis_prefix}breaker:",
                                       **options)  # type: ignore[arg-type]
        made.append(breaker)
        return breaker

    yield make
    for breaker in made:
        await breaker.aclose()


def _fail(breaker: CircuitBreaker, times: int) -> None:
    for _ in range(times):
        permit = breaker.try_acquire()
        assert permit is not None
        permit.record_failure()


async def test_an_opening_in_one_process_refuses_calls_in_the_other(make: Make) -> None:
    """Failures seen by one breaker open it; the other, which saw none, refuses too."""
    one, other = make(), make()
    _fail(one, 2)
    assert one.try_acquire() is None  # opened, and its opening written in the background
    await asyncio.gather(*one._tasks)
    await other.sync()
    assert other.state is CircuitState.OPEN
    assert other.try_acquire() is None
    assert 1.5 < other.remaining_cooldown <= 2.0


async def test_a_breaker_of_another_name_is_not_opened(make: Make) -> None:
    """Only breakers of the same name share a state."""
    one, other = make(), make(name="cache")
    _fail(one, 2)
    one.try_acquire()
    await asyncio.gather(*one._tasks)
    await other.sync()
    assert other.state is CircuitState.CLOSED
    assert other.try_acquire() is not None


async def test_the_shared_opening_ends_with_its_cooldown(
    make: Make, caplog: pytest.LogCaptureFixture,
) -> None:
    """Once the opening's cooldown is over, the other process calls again; the adoption
    and its end are one log line each."""
    one, other = make(cooldown=0.3), make(cooldown=0.3)
    with caplog.at_level(logging.INFO, logger="ratelimit_mw.breaker"):
        _fail(one, 2)
        one.try_acquire()
        await asyncio.gather(*one._tasks)
        await other.sync()
        assert other.try_acquire() is None
        await asyncio.sleep(0.35)
        assert other.try_acquire() is not None
    lines = [r.getMessage() for r in caplog.records]
    assert sum("opened by another process" in line for line in lines) == 1
    assert sum("shared by another process ended" in line for line in lines) == 1


async def test_redis_unreachable_leaves_each_process_its_own_state(
    redis_prefix: str,
) -> None:
    """A Redis that can't be reached changes nothing: the breaker still opens on its own
    failures and closes after them, without raising."""
    client = aioredis.Redis(host="127.0.0.1", port=1, socket_connect_timeout=0.2)
    breaker = SharedCircuitBreaker(name="db", redis=client, window_size=2, minimum_calls=2,
                                   cooldown=0.1, sync_interval=0.01)
    try:
        assert breaker.try_acquire() is not None
        _fail(breaker, 2)
        assert breaker.try_acquire() is None
        await asyncio.sleep(0.15)
        permit = breaker.try_acquire()
        assert permit is not None
        permit.record_success()
        assert breaker.state is CircuitState.CLOSED
    finally:
        await breaker.aclose()
        await client.aclose()


def test_a_bad_client_is_refused_at_start_up() -> None:
    with pytest.raises(TypeError, match=r"redis must be a redis\.asyncio\.Redis client"):
        SharedCircuitBreaker(redis=42)  # type: ignore[arg-type]

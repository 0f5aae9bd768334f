"""The Redis store while Redis is frozen or gone: bounded calls, a breaker, a quick recovery.

The frozen Redis is a redis-server of the test's own, stopped with SIGSTOP: it accepts
connections and reads nothing, as a hung server or a black-holed network would.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import re
import signal
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import httpx
import pytest
import redis.asyncio as aioredis

from ratelimit_mw.breaker import CircuitBreaker
from ratelimit_mw.errors import ConfigError, StorageError
from ratelimit_mw.idempotency import RedisIdempotencyStore, record_key
from ratelimit_mw.idempotency.redis import DEFAULT_RECOVERY_INTERVAL, DEFAULT_TIMEOUT
from tests.conftest import FakeClock, free_port
from tests.middleware.conftest import RedisServer

from .conftest import Orders

pytestmark = pytest.mark.redis

KEY = record_key("api-key:alice", "order-1")
FP = "a" * 64
# Generous: the host may be a busy 2-core machine. An answer without a Redis call
# takes about a millisecond; one that waits for the timeout takes DEFAULT_TIMEOUT.
FAST = 0.1
SLACK = 1.5

StoreFactory = Callable[..., RedisIdempotencyStore]


@contextlib.contextmanager
def frozen(server: RedisServer) -> Iterator[None]:
    """Redis stopped with SIGSTOP for the block, and resumed however the block ends."""
    assert server.proc is not None
    os.kill(server.proc.pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(server.proc.pid, signal.SIGCONT)


@pytest.fixture(params=["from_url", "client"])
async def make_store(
    request: pytest.FixtureRequest, redis_server: RedisServer
) -> AsyncIterator[StoreFactory]:
    """Stores on the test's Redis, built from a URL or around a client made elsewhere
    (which has no socket timeout of its own); all closed after."""
    made: list[RedisIdempotencyStore] = []
    clients: list[aioredis.Redis] = []

    def factory(**options: Any) -> RedisIdempotencyStore:
        prefix = f"idem-outage:{uuid.uuid4().hex[:8]}:"
        if request.param == "from_url":
            store = RedisIdempotencyStore.from_url(redis_server.url, prefix=prefix, **options)
        else:
            client = aioredis.Redis.from_url(redis_server.url)
            clients.append(client)
            store = RedisIdempotencyStore(client, prefix=prefix, **options)
        made.append(store)
        return store

    yield factory
    for store in made:
        await store.close()
    for client in clients:
        await client.aclose()


@contextlib.asynccontextmanager
async def client_for(orders: Orders, store: RedisIdempotencyStore, **options: Any,
                     ) -> AsyncIterator[httpx.AsyncClient]:
    """An in-process client of the test app on ``store``."""
    transport = httpx.ASGITransport(app=orders.app(store, **options))
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        yield client


async def keyed_post(client: httpx.AsyncClient) -> tuple[httpx.Response, float]:
    """A POST with a fresh Idempotency-Key, and the seconds it took (a hang fails at 10 s)."""
    headers = {"Idempotency-Key": uuid.uuid4().hex, "X-API-Key": "alice"}
    start = time.perf_counter()
    response = await asyncio.wait_for(client.post("/orders", content=b"x", headers=headers), 10)
    return response, time.perf_counter() - start


async def posts_while_frozen(
    server: RedisServer, store: RedisIdempotencyStore, count: int, **options: Any
) -> tuple[Orders, list[tuple[httpx.Response, float]]]:
    """One keyed POST on a working Redis, then ``count`` while it is frozen, timed."""
    orders = Orders()
    async with client_for(orders, store, **options) as client:
        assert (await keyed_post(client))[0].status_code == 201
        with frozen(server):
            return orders, [await keyed_post(client) for _ in range(count)]


async def test_frozen_redis_does_not_hang_a_keyed_request(
    make_store: StoreFactory, redis_server: RedisServer
) -> None:
    """With the default timeout a keyed POST to a frozen Redis gets its 503 within it."""
    orders, [(response, took)] = await posts_while_frozen(redis_server, make_store(), 1)
    assert response.status_code == 503
    assert response.headers["Retry-After"] == "1"
    assert response.json()["error"] == "idempotency_unavailable"
    assert took < DEFAULT_TIMEOUT + SLACK
    assert orders.runs["create"] == 1


async def test_while_frozen_most_requests_fail_fast(
    make_store: StoreFactory, redis_server: RedisServer
) -> None:
    """After a few timeouts the breaker answers at once: 20 requests cost ~2 timeouts."""
    orders, results = await posts_while_frozen(redis_server, make_store(), 20)
    assert [r.status_code for r, _ in results] == [503] * 20
    slow = [took for _, took in results if took >= FAST]
    assert len(slow) <= 4, [round(took, 3) for _, took in results]
    assert sum(took for _, took in results) < 4 * DEFAULT_TIMEOUT + SLACK
    assert orders.runs["create"] == 1  # nothing ran unprotected


async def test_while_frozen_fail_open_runs_requests_without_waiting(
    make_store: StoreFactory, redis_server: RedisServer
) -> None:
    """With fail_open the requests run (without idempotency), and most without the wait."""
    orders, results = await posts_while_frozen(redis_server, make_store(), 10, fail_open=True)
    assert [r.status_code for r, _ in results] == [201] * 10
    assert len([took for _, took in results if took >= FAST]) <= 4
    assert orders.runs["create"] == 11


async def test_redis_frozen_while_the_handler_runs_delays_the_answer_briefly(
    make_store: StoreFactory, redis_server: RedisServer
) -> None:
    """Storing the response (a shielded call) is bounded too: the client gets its answer."""
    orders = Orders()
    orders.gate.clear()
    async with client_for(orders, make_store()) as client:
        sent = asyncio.create_task(keyed_post(client))
        while not orders.runs["create"]:
            await asyncio.sleep(0.005)
        with frozen(redis_server):
            start = time.perf_counter()
            orders.gate.set()
            response, _ = await sent
            took = time.perf_counter() - start
    assert response.status_code == 201
    assert took < 2 * DEFAULT_TIMEOUT + SLACK  # the store, then the release of the key


@pytest.mark.slow
async def test_store_works_again_soon_after_sigcont(
    make_store: StoreFactory, redis_server: RedisServer
) -> None:
    """Once Redis resumes, a trial call closes the breaker within a few seconds."""
    orders = Orders()
    async with client_for(orders, make_store()) as client:
        with frozen(redis_server):
            for _ in range(5):
                assert (await keyed_post(client))[0].status_code == 503
        resumed = time.monotonic()
        headers = {"Idempotency-Key": "after-the-outage", "X-API-Key": "alice"}

        async def post() -> httpx.Response:
            return await asyncio.wait_for(
                client.post("/orders", content=b"x", headers=headers), 10)

        while (response := await post()).status_code == 503:
            assert time.monotonic() - resumed < DEFAULT_RECOVERY_INTERVAL + 5
            await asyncio.sleep(0.05)
        recovered = time.monotonic() - resumed
        assert response.status_code == 201
        replay = await post()
    assert replay.headers["X-Idempotent-Replayed"] == "true"
    assert replay.json() == response.json()
    assert recovered < DEFAULT_RECOVERY_INTERVAL + DEFAULT_TIMEOUT + SLACK


async def test_open_breaker_refuses_without_calling_redis() -> None:
    """Three failed calls open the breaker: the next is refused at once, and after the
    recovery interval one trial call reaches Redis again."""
    clock = FakeClock(0.0)
    breaker = CircuitBreaker(name="test", window_size=10, minimum_calls=3, cooldown=2.0,
                             clock=clock)
    store = RedisIdempotencyStore.from_url(f"redis://127.0.0.1:{free_port()}", breaker=breaker)
    try:
        for _ in range(3):
            with pytest.raises(StorageError, match="claim") as tried:
                await store.claim(KEY, FP, lock_ttl=60)
            assert "not tried" not in str(tried.value)
        with pytest.raises(StorageError, match=r"not tried.*next try in 2\.0 s"):
            await store.claim(KEY, FP, lock_ttl=60)
        with pytest.raises(StorageError, match=r"release.*not tried"):
            await store.release(KEY, "token")
        clock.advance(2.0)
        with pytest.raises(StorageError, match="claim") as trial:
            await store.claim(KEY, FP, lock_ttl=60)
        assert "not tried" not in str(trial.value)
    finally:
        await store.close()


async def test_503_says_how_long_the_breaker_refuses() -> None:
    """Retry-After is 1 while the breaker still lets calls through, then the seconds
    left of its cooldown (rounded up), so a client that obeys it is not refused again."""
    store = RedisIdempotencyStore.from_url(f"redis://127.0.0.1:{free_port()}",
                                           recovery_interval=5.0)
    try:
        async with client_for(Orders(), store) as client:
            answers = [(await keyed_post(client))[0] for _ in range(4)]
    finally:
        await store.close()
    assert [r.status_code for r in answers] == [503] * 4
    assert [r.headers["retry-after"] for r in answers] == ["1", "1", "5", "5"]


BAD_SECONDS = [-1, -0.5, 0, 0.0, math.nan, math.inf, True, False, "0.5", None]


@pytest.mark.parametrize("option", ["timeout", "recovery_interval"])
@pytest.mark.parametrize("value", BAD_SECONDS, ids=repr)
async def test_bad_seconds_fail_at_construction(option: str, value: object) -> None:
    """A timeout or recovery interval that is not a positive number is a ConfigError
    naming it, from a URL or around a client."""
    expected = re.escape(f"got {value!r}")
    with pytest.raises(ConfigError, match=expected):
        RedisIdempotencyStore.from_url("redis://127.0.0.1:1", **{option: value})
    client = aioredis.Redis.from_url("redis://127.0.0.1:1")
    try:
        with pytest.raises(ConfigError, match=expected):
            RedisIdempotencyStore(client, **{option: value})
    finally:
        await client.aclose()


async def test_default_timeout_applies_to_a_client_made_elsewhere() -> None:
    """A store around a client without socket timeouts still bounds every call."""
    client = aioredis.Redis.from_url("redis://127.0.0.1:1")
    try:
        store = RedisIdempotencyStore(client)
        assert store.timeout == DEFAULT_TIMEOUT
        assert "timeout=0.25" in repr(store)
    finally:
        await client.aclose()

"""The store contract, run on memory and Redis alike: claims, leases, completion, expiry."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
import redis.asyncio as aioredis

from ratelimit_mw.errors import ConfigError, StorageError
from ratelimit_mw.idempotency import (
    IdempotencyStore,
    MemoryIdempotencyStore,
    RedisIdempotencyStore,
    StoredResponse,
    record_key,
)
from ratelimit_mw.idempotency.redis import script_source
from tests.conftest import FakeClock, free_port

KEY = record_key("api-key:alice", "order-1")
FP, OTHER_FP = "a" * 64, "b" * 64
RESPONSE = StoredResponse(201, ((b"content-type", b"application/json"),), b'{"id": 1}')
DAY = 24 * 3600.0


@pytest.fixture
async def store(
    backend: str, clock: FakeClock, request: pytest.FixtureRequest
) -> AsyncIterator[IdempotencyStore]:
    """One store of the matrix; the memory one runs on the fake clock."""
    if backend == "memory":
        yield MemoryIdempotencyStore(clock=clock)
        return
    url = request.getfixturevalue("redis_url")
    prefix = request.getfixturevalue("redis_prefix")
    store = RedisIdempotencyStore.from_url(url, prefix=prefix)
    yield store
    await store.close()


async def expire(store: IdempotencyStore, clock: FakeClock, seconds: float) -> None:
    """Let ``seconds`` pass for the store: move the fake clock, or cut the Redis TTL."""
    if isinstance(store, MemoryIdempotencyStore):
        clock.advance(seconds)
        return
    assert isinstance(store, RedisIdempotencyStore)
    await store._client.pexpire(store.prefix + KEY, 1)
    while await store._client.exists(store.prefix + KEY):
        pass


async def test_claim_then_busy_then_mismatch(store: IdempotencyStore) -> None:
    """A claimed key is in flight for the same request and a mismatch for another."""
    claim = await store.claim(KEY, FP, lock_ttl=60)
    assert claim.outcome == "claimed" and claim.token
    assert (await store.claim(KEY, FP, lock_ttl=60)).outcome == "in_flight"
    assert (await store.claim(KEY, OTHER_FP, lock_ttl=60)).outcome == "mismatch"


async def test_completed_key_replays_its_response(store: IdempotencyStore) -> None:
    """After completion the same request gets the response; another gets a mismatch."""
    claim = await store.claim(KEY, FP, lock_ttl=60)
    assert await store.complete(KEY, claim.token, FP, RESPONSE, ttl=DAY)
    done = await store.claim(KEY, FP, lock_ttl=60)
    assert done.outcome == "done"
    assert done.response == RESPONSE
    assert (await store.claim(KEY, OTHER_FP, lock_ttl=60)).outcome == "mismatch"


async def test_binary_bodies_and_header_bytes_survive(store: IdempotencyStore) -> None:
    """Every byte value of the body and latin-1 header bytes come back unchanged."""
    response = StoredResponse(200, ((b"x-name", b"caf\xe9 \xff"), (b"set-cookie", b"a=1")),
                              bytes(range(256)) * 4)
    claim = await store.claim(KEY, FP, lock_ttl=60)
    await store.complete(KEY, claim.token, FP, response, ttl=DAY)
    assert (await store.claim(KEY, FP, lock_ttl=60)).response == response


async def test_release_frees_the_key_for_its_holder_only(store: IdempotencyStore) -> None:
    """A release with another token does nothing; the holder's release frees the key."""
    claim = await store.claim(KEY, FP, lock_ttl=60)
    await store.release(KEY, "not-the-token")
    assert (await store.claim(KEY, FP, lock_ttl=60)).outcome == "in_flight"
    await store.release(KEY, claim.token)
    assert (await store.claim(KEY, OTHER_FP, lock_ttl=60)).outcome == "claimed"


async def test_release_never_drops_a_stored_response(store: IdempotencyStore) -> None:
    """Releasing after completion keeps the response."""
    claim = await store.claim(KEY, FP, lock_ttl=60)
    await store.complete(KEY, claim.token, FP, RESPONSE, ttl=DAY)
    await store.release(KEY, claim.token)
    assert (await store.claim(KEY, FP, lock_ttl=60)).outcome == "done"


async def test_lease_expires_when_the_worker_dies(
    store: IdempotencyStore, clock: FakeClock
) -> None:
    """An in-flight key is free again once its lease runs out."""
    await store.claim(KEY, FP, lock_ttl=60)
    await expire(store, clock, 60)
    assert (await store.claim(KEY, FP, lock_ttl=60)).outcome == "claimed"


async def test_stale_holder_cannot_overwrite_the_new_one(
    store: IdempotencyStore, clock: FakeClock
) -> None:
    """A worker whose lease ran out and was re-claimed stores nothing and frees nothing."""
    stale = await store.claim(KEY, FP, lock_ttl=60)
    await expire(store, clock, 60)
    fresh = await store.claim(KEY, FP, lock_ttl=60)
    assert not await store.complete(KEY, stale.token, FP, RESPONSE, ttl=DAY)
    await store.release(KEY, stale.token)
    assert (await store.claim(KEY, FP, lock_ttl=60)).outcome == "in_flight"
    assert await store.complete(KEY, fresh.token, FP, RESPONSE, ttl=DAY)


async def test_late_completion_still_counts(store: IdempotencyStore, clock: FakeClock) -> None:
    """A response finished after the lease ran out, with nobody else holding the key, is kept."""
    claim = await store.claim(KEY, FP, lock_ttl=60)
    await expire(store, clock, 60)
    assert await store.complete(KEY, claim.token, FP, RESPONSE, ttl=DAY)
    assert (await store.claim(KEY, FP, lock_ttl=60)).outcome == "done"


async def test_completing_again_with_the_same_token_counts(store: IdempotencyStore) -> None:
    """A second complete by the holder (the first timed out but ran) is True and keeps
    the first response."""
    claim = await store.claim(KEY, FP, lock_ttl=60)
    assert await store.complete(KEY, claim.token, FP, RESPONSE, ttl=DAY)
    other = StoredResponse(200, (), b"other")
    assert await store.complete(KEY, claim.token, FP, other, ttl=DAY)
    assert not await store.complete(KEY, "not-the-token", FP, other, ttl=DAY)
    assert (await store.claim(KEY, FP, lock_ttl=60)).response == RESPONSE


async def test_renewed_lease_outlives_its_first_ttl(
    store: IdempotencyStore, clock: FakeClock
) -> None:
    """A renewed lease holds the key lock_ttl from the renewal, not from the claim."""
    claim = await store.claim(KEY, FP, lock_ttl=60)
    if isinstance(store, MemoryIdempotencyStore):
        clock.advance(40)
    assert await store.renew(KEY, claim.token, lock_ttl=60)
    if isinstance(store, MemoryIdempotencyStore):
        clock.advance(40)  # 80 s after the claim, 40 s after the renewal
    else:
        assert isinstance(store, RedisIdempotencyStore)
        assert 59_000 < await store._client.pttl(store.prefix + KEY) <= 60_000
    assert (await store.claim(KEY, FP, lock_ttl=60)).outcome == "in_flight"


async def test_only_the_holder_renews_a_lease_in_flight(
    store: IdempotencyStore, clock: FakeClock
) -> None:
    """Renewing with another token, after completion or after expiry does nothing."""
    claim = await store.claim(KEY, FP, lock_ttl=60)
    assert not await store.renew(KEY, "not-the-token", lock_ttl=60)
    await expire(store, clock, 60)
    assert not await store.renew(KEY, claim.token, lock_ttl=60)
    fresh = await store.claim(KEY, FP, lock_ttl=60)
    await store.complete(KEY, fresh.token, FP, RESPONSE, ttl=DAY)
    assert not await store.renew(KEY, fresh.token, lock_ttl=60)
    assert (await store.claim(KEY, FP, lock_ttl=60)).outcome == "done"


async def test_completed_key_expires(store: IdempotencyStore, clock: FakeClock) -> None:
    """After ``ttl`` the response is forgotten and the key can be claimed again."""
    claim = await store.claim(KEY, FP, lock_ttl=60)
    await store.complete(KEY, claim.token, FP, RESPONSE, ttl=DAY)
    if isinstance(store, MemoryIdempotencyStore):
        clock.advance(DAY - 1)
        assert (await store.claim(KEY, FP, lock_ttl=60)).outcome == "done"
    await expire(store, clock, 1)
    assert (await store.claim(KEY, OTHER_FP, lock_ttl=60)).outcome == "claimed"


@pytest.mark.parametrize("backend", ["redis"])
async def test_redis_keys_are_prefixed_hashed_and_expiring(
    store: IdempotencyStore, redis_url: str
) -> None:
    """One key per record: the prefix and a hex digest, with a TTL in flight and once done."""
    assert isinstance(store, RedisIdempotencyStore)
    hostile = record_key("{user}:1" + "x" * 10_000, "}{:*")
    probe = aioredis.Redis.from_url(redis_url)
    try:
        claim = await store.claim(hostile, FP, lock_ttl=60)
        names = [n.decode() async for n in probe.scan_iter(match=store.prefix + "*")]
        assert names == [store.prefix + hostile]
        assert len(hostile) == 64 and set(hostile) <= set("0123456789abcdef")
        assert 59_000 < await probe.pttl(names[0]) <= 60_000
        await store.complete(hostile, claim.token, FP, RESPONSE, ttl=DAY)
        assert DAY * 1000 - 5000 < await probe.pttl(names[0]) <= DAY * 1000
    finally:
        await probe.aclose()


def test_lua_scripts_are_package_data() -> None:
    """The scripts are read from the package with importlib.resources, units on line 1."""
    for name in ("claim", "complete", "renew", "release"):
        first_line = script_source(name).splitlines()[0]
        assert first_line.startswith("-- ")
    assert "milliseconds" in script_source("claim").splitlines()[0]


@pytest.mark.slow
@pytest.mark.parametrize("deployment", ["cluster", "sentinel"])
async def test_redis_store_from_cluster_and_sentinel_urls(
    deployment: str, request: pytest.FixtureRequest
) -> None:
    """The rate limiter's Cluster and Sentinel URLs keep idempotency records too."""
    url = request.getfixturevalue(f"redis_{deployment}_url")
    # The first call discovers the topology and connects: on a loaded host that can pass
    # the default 0.25 s, which this test of the URLs is not about.
    store = RedisIdempotencyStore.from_url(url, prefix=f"idem-{uuid.uuid4().hex[:8]}:",
                                           timeout=2.0)
    try:
        claim = await store.claim(KEY, FP, lock_ttl=60)
        assert claim.outcome == "claimed"
        assert await store.renew(KEY, claim.token, lock_ttl=60)
        assert await store.complete(KEY, claim.token, FP, RESPONSE, ttl=60)
        assert (await store.claim(KEY, FP, lock_ttl=60)).response == RESPONSE
    finally:
        await store.close()


def test_redis_store_refuses_a_url_it_cannot_use() -> None:
    """Another scheme is a ConfigError naming the URL (password hidden), not memory."""
    with pytest.raises(ConfigError, match=r"memcached://app:\*\*\*@cache:11211.*redis\+sentinel"):
        RedisIdempotencyStore.from_url("memcached://app:secret@cache:11211")


async def test_redis_refuses_a_decoding_client(redis_url: str) -> None:
    """A client that decodes replies to str would corrupt binary bodies: refused."""
    client = aioredis.Redis.from_url(redis_url, decode_responses=True)
    try:
        with pytest.raises(ConfigError, match="decode_responses"):
            RedisIdempotencyStore(client)
    finally:
        await client.aclose()


@pytest.mark.parametrize("prefix", ["{tag}:", "a}", 3])
def test_redis_prefix_without_braces(prefix: object) -> None:
    """A prefix with braces would change the Cluster hash slot: refused."""
    with pytest.raises(ConfigError, match="prefix"):
        RedisIdempotencyStore.from_url("redis://127.0.0.1:1", prefix=prefix)  # type: ignore[arg-type]


async def test_redis_down_raises_storage_error() -> None:
    """A Redis that does not answer is a StorageError, for the middleware to handle."""
    store = RedisIdempotencyStore.from_url(f"redis://127.0.0.1:{free_port()}", timeout=0.5)
    try:
        with pytest.raises(StorageError, match="claim"):
            await store.claim(KEY, FP, lock_ttl=60)
        with pytest.raises(StorageError, match="store"):
            await store.complete(KEY, "t", FP, RESPONSE, ttl=DAY)
        with pytest.raises(StorageError, match="release"):
            await store.release(KEY, "t")
    finally:
        await store.close()


async def test_memory_store_stays_bounded(clock: FakeClock) -> None:
    """Beyond max_entries the finished response nearest its expiry is forgotten."""
    store = MemoryIdempotencyStore(clock=clock, max_entries=3)
    for index in range(5):
        claim = await store.claim(f"k{index}", FP, lock_ttl=60)
        await store.complete(f"k{index}", claim.token, FP, RESPONSE, ttl=DAY)
    assert len(store) == 3
    assert (await store.claim("k4", FP, lock_ttl=60)).outcome == "done"
    assert (await store.claim("k0", FP, lock_ttl=60)).outcome == "claimed"


async def test_memory_store_never_evicts_a_lease_in_flight(clock: FakeClock) -> None:
    """A full store forgets finished responses first; full of leases, it refuses the claim
    like a store that is down, and the running requests keep their keys."""
    store = MemoryIdempotencyStore(clock=clock, max_entries=3)
    claim = await store.claim("done", FP, lock_ttl=60)
    await store.complete("done", claim.token, FP, RESPONSE, ttl=DAY)
    await store.claim("paying", FP, lock_ttl=60)
    other = await store.claim("other", FP, lock_ttl=60)
    assert (await store.claim("new", FP, lock_ttl=60)).outcome == "claimed"
    with pytest.raises(StorageError, match="full: 3 requests are in flight"):
        await store.claim("one-more", FP, lock_ttl=60)
    assert (await store.claim("paying", FP, lock_ttl=60)).outcome == "in_flight"
    await store.release("other", other.token)
    assert (await store.claim("done", FP, lock_ttl=60)).outcome == "claimed"  # forgotten


async def test_memory_store_drops_expired_records_first(clock: FakeClock) -> None:
    """Expired leases and responses go before anything live is forgotten."""
    store = MemoryIdempotencyStore(clock=clock, max_entries=3)
    await store.claim("old-lease", FP, lock_ttl=10)
    claim = await store.claim("old-response", FP, lock_ttl=10)
    await store.complete("old-response", claim.token, FP, RESPONSE, ttl=10)
    clock.advance(10)
    for key in ("a", "b", "c"):
        assert (await store.claim(key, FP, lock_ttl=60)).outcome == "claimed"
    assert len(store) == 3
    assert (await store.claim("a", FP, lock_ttl=60)).outcome == "in_flight"


async def test_memory_store_at_max_entries_forgets_the_oldest_response_only() -> None:
    """At max_entries a claim forgets the one finished response nearest its expiry (the
    front of its expiry order: no scan of them all), and keeps the others."""
    store = MemoryIdempotencyStore(max_entries=1000)
    for index in range(1000):
        claim = await store.claim(f"k{index}", FP, lock_ttl=60)
        await store.complete(f"k{index}", claim.token, FP, RESPONSE, ttl=DAY)
    for index in range(3):
        assert (await store.claim(f"new{index}", FP, lock_ttl=60)).outcome == "claimed"
    assert len(store) == 1000
    assert [(await store.claim(f"k{index}", FP, lock_ttl=60)).outcome
            for index in (3, 999)] == ["done", "done"]
    # The three oldest were forgotten: claimed afresh now.
    assert (await store.claim("k0", FP, lock_ttl=60)).outcome == "claimed"


@pytest.mark.parametrize("value", [0, -1, 1.5, True])
def test_memory_store_size_is_checked(value: object) -> None:
    """max_entries must be a whole number >= 1."""
    with pytest.raises(ConfigError, match="max_entries"):
        MemoryIdempotencyStore(max_entries=value)  # type: ignore[arg-type]


async def test_a_store_without_renew_keeps_its_leases_as_claimed() -> None:
    """A custom store written before renew existed still works: renew says False (the
    lease runs its lock_ttl from the claim)."""
    from ratelimit_mw.idempotency.store import IdempotencyStore

    class Plain(IdempotencyStore):
        async def claim(self, key: str, fingerprint: str, *, lock_ttl: float) -> Any:
            raise NotImplementedError

        async def complete(self, *args: Any, **kwargs: Any) -> bool:
            return True

        async def release(self, key: str, token: str) -> None:
            return None

    assert await Plain().renew("k", "t", lock_ttl=1.0) is False

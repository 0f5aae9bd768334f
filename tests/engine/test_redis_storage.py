"""What only the Redis storage promises: one round trip, Redis's clock, TTLs, NOSCRIPT."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
import redis.asyncio as aioredis
from redis.crc import key_slot

from ratelimit_mw import ConfigError, Hit, Limit, MemoryStorage, RedisStorage, storage_from_url
from ratelimit_mw.errors import StorageError
from ratelimit_mw.limits import ALGORITHM_NAMES
from ratelimit_mw.middleware import RateLimitMiddleware
from ratelimit_mw.rates import MAX_PERIOD, Rate
from ratelimit_mw.settings import RateLimitSettings
from ratelimit_mw.storage import check_storage_url
from ratelimit_mw.storage.cluster import cluster_storage_from_url
from ratelimit_mw.storage.keys import encode_part, redis_key
from tests.conftest import FakeClock, on_clock
from tests.engine.test_storage import limit_for
from tests.middleware.conftest import RedisServer
from tests.wire_recording import Writes, recording_storage


@pytest.fixture
async def storage(redis_url: str, redis_prefix: str) -> AsyncIterator[RedisStorage]:
    storage = RedisStorage.from_url(redis_url, prefix=redis_prefix)
    yield storage
    await storage.close()


@pytest.fixture
async def raw(redis_url: str) -> AsyncIterator[aioredis.Redis]:
    client = aioredis.Redis.from_url(redis_url)
    yield client
    await client.aclose()


@pytest.fixture
async def on_own_redis(
    own_redis_url: str, redis_prefix: str,
) -> AsyncIterator[tuple[RedisStorage, aioredis.Redis]]:
    """A storage and a plain client on the session's own Redis, for tests that flush
    its scripts."""
    storage = RedisStorage.from_url(own_redis_url, prefix=redis_prefix)
    client = aioredis.Redis.from_url(own_redis_url)
    yield storage, client
    await client.aclose()
    await storage.close()


def three_limits() -> list[Hit]:
    return [Hit(Limit("10/minute", "token_bucket", burst=20)),
            Hit(Limit("1000/day", "fixed_window")),
            Hit(Limit("100/hour", "sliding_window"))]


async def test_one_command_per_decision_with_three_limits(
    redis_url: str, redis_prefix: str, raw: aioredis.Redis,
) -> None:
    """Three limits cost one FCALL each decision, counted on the wire and by Redis."""
    writes = Writes()
    storage = recording_storage(redis_url, writes, prefix=redis_prefix)
    try:
        await storage.decide("warm", three_limits())  # loads the library once
        writes.clear()
        before = await raw.info("commandstats")
        for i in range(50):
            await storage.decide(f"user-{i % 5}", three_limits())
        after = await raw.info("commandstats")
    finally:
        await storage.close()
    assert writes.commands() == [b"FCALL"] * 50
    assert after["cmdstat_fcall"]["calls"] - before["cmdstat_fcall"]["calls"] >= 50


async def test_every_key_has_a_ttl(storage: RedisStorage, raw: aioredis.Redis) -> None:
    """Nothing leaks: every key written has a TTL no longer than its window plus slack."""
    hits = [Hit(limit_for(name, "5/minute")) for name in ALGORITHM_NAMES]
    hits.append(Hit(Limit.concurrency(10, lease=20)))
    for i in range(7):
        await storage.decide(f"k{i % 3}", hits, usage=True)
    names = [name.decode() async for name in raw.scan_iter(match=storage.prefix + "*")]
    assert len(names) == 3 * (len(ALGORITHM_NAMES) + 1 + 2)  # limits, slots, hour, day
    for name in names:
        ttl = await raw.pttl(name)
        if ":u:" in name:
            assert 0 < ttl <= 91 * 86_400_000, name
        else:
            assert 0 < ttl <= 2 * 60_000 + 1_000, name


@pytest.mark.parametrize("algorithm", ["fixed_window", "sliding_window"])
async def test_a_window_key_gets_its_ttl_when_its_window_opens(
    redis_url: str, redis_prefix: str, raw: aioredis.Redis, algorithm: str,
) -> None:
    """A window's key lives to a fixed end (the window's, or the next one's for the
    sliding window), set by the window's first request: later requests in the window
    only write their count. Seen on simulated time: a request 30 s into the window would
    otherwise set a time to live 30 s shorter."""
    clock = FakeClock(1_800_000_000.0 - 1_800_000_000 % 60)  # a minute boundary
    storage = on_clock(RedisStorage.from_url(redis_url, prefix=redis_prefix), clock)
    limit = Limit("100/minute", algorithm)
    name = redis_key(redis_prefix, "w", "", limit.uid)
    life = 60_000 if algorithm == "fixed_window" else 120_000  # ms, from the window's start
    try:
        assert (await storage.decide("w", [Hit(limit)])).allowed
        first = await raw.pttl(name)
        assert life < first <= life + 1_000
        clock.advance(30)
        for _ in range(3):
            assert (await storage.decide("w", [Hit(limit)])).allowed
        assert first - 1_000 < await raw.pttl(name) <= first
        clock.advance(30)  # the next window opens: its key lives to its own end
        assert (await storage.decide("w", [Hit(limit)])).allowed
        assert life < await raw.pttl(name) <= life + 1_000
        assert int(await raw.hget(name, "c")) == 1
    finally:
        await storage.close()


async def test_the_commands_a_decision_runs_inside_redis() -> None:
    """What the script asks of Redis, counted on a server of the test's own (on
    simulated time, so without TIME): a window sets its key's time to live once per
    window, and a caller with no request in flight costs its concurrency limit one
    lookup, not two, and no clearing out of ended leases."""
    server = RedisServer()
    server.start()
    clock = FakeClock(1_800_000_000.0 - 1_800_000_000 % 60)
    storage = on_clock(RedisStorage.from_url(server.url), clock)
    raw = aioredis.Redis.from_url(server.url)
    hits = [Hit(Limit("100/minute", "fixed_window")),
            Hit(Limit("100/minute", "sliding_window")),
            Hit(Limit("100/minute", "token_bucket")),
            Hit(Limit.concurrency(5, lease=30))]

    async def commands(*decisions: bool) -> dict[str, int]:
        """Commands run by the decisions (True: give the slot back after it)."""
        await raw.config_resetstat()
        for give_back in decisions:
            verdict = await storage.decide("k", hits)
            assert verdict.allowed
            if give_back:
                await storage.release(verdict.leases)
            clock.advance(1)
        stats = await raw.info("commandstats")
        return {name.removeprefix("cmdstat_"): stat["calls"] for name, stat in stats.items()
                if name not in ("cmdstat_fcall", "cmdstat_config|resetstat", "cmdstat_zrem")}

    try:
        warm = await storage.decide("warm-up", hits)  # connects and loads the script
        await storage.release(warm.leases)
        first = await commands(True)  # every key new: each gets its time to live
        assert first == {"hmget": 3, "zrange": 1, "hset": 3, "pexpire": 4, "zadd": 1}
        idle = await commands(True, True)  # the same windows, nothing in flight
        assert idle == {"hmget": 6, "zrange": 2, "hset": 6, "pexpire": 4, "zadd": 2}
        busy = await commands(False, False)  # the first slot still held at the second
        assert busy["zcount"] == 1 and busy["zrange"] == 2 and busy["pexpire"] == 4
        assert busy["zremrangebyscore"] == 1  # the second finds a lease to clear out
    finally:
        await storage.close()
        await raw.aclose()
        server.stop()


@pytest.mark.parametrize("limit", [
    Limit(Rate(1, MAX_PERIOD), "sliding_window"),
    Limit(Rate(1, MAX_PERIOD), "fixed_window"),
    Limit(Rate(1, MAX_PERIOD), "sliding_log"),
    Limit(Rate(1, MAX_PERIOD), "gcra"),
    Limit(Rate(1, 86400), "token_bucket", burst=3650),  # ten years to refill
], ids=str)
async def test_the_longest_limits_deny_promptly_and_exactly(
    storage: RedisStorage, raw: aioredis.Redis, limit: Limit,
) -> None:
    """At the longest period (and refill) allowed, a denial is answered at once with the
    same wait as memory storage's (Redis's searches for the retry time end), and the
    key still expires."""
    hits = [Hit(limit, limit.capacity)]
    assert (await storage.decide("long", hits)).allowed
    memory = MemoryStorage()
    assert (await memory.decide("long", hits)).allowed
    denied = await asyncio.wait_for(storage.decide("long", [Hit(limit)]), 5)
    expected = (await memory.decide("long", [Hit(limit)])).retry_after
    assert not denied.allowed
    assert abs(denied.retry_after - expected) < 2
    name = redis_key(storage.prefix, "long", "", limit.uid)
    assert 0 < await raw.pttl(name) <= 2 * MAX_PERIOD * 1000 + 1000


async def test_a_storage_without_the_pipeline_keeps_to_its_timeout() -> None:
    """The path Cluster takes (no pipelined connection) is bounded by the storage's own
    timeout too, not only by a timeout the caller passes: against a frozen Redis, a
    decision, a release and a usage read each fail within it, as StorageError."""
    import os
    import signal

    server = RedisServer()
    server.start()
    client = aioredis.Redis.from_url(server.url)
    storage = RedisStorage(client, pipeline=False, timeout=0.3)
    limit = Limit.concurrency(5, lease=30)
    try:
        verdict = await storage.decide("k", [Hit(limit)])  # connected, script loaded
        assert server.proc is not None
        os.kill(server.proc.pid, signal.SIGSTOP)
        try:
            for call in (lambda: storage.decide("k", [Hit(limit)]),
                         lambda: storage.release(verdict.leases),
                         lambda: storage.usage("k", "hour", 0, 3600)):
                started = time.monotonic()
                with pytest.raises(StorageError):
                    await call()
                assert time.monotonic() - started < 1.5
        finally:
            os.kill(server.proc.pid, signal.SIGCONT)
    finally:
        await client.aclose()
        server.stop()


async def test_a_slot_taken_by_a_decision_redis_ran_after_the_cut_off_is_given_back() -> None:
    """Redis frozen past a decision's grace period: the connection is cut off, the
    caller long answered by the failure policy; resumed, Redis runs the script it had
    read and takes a slot for nobody. Once Redis answers again, that slot goes back
    (it stayed taken for its whole lease, and a cap of one refused the client)."""
    import os
    import signal

    server = RedisServer()
    server.start()
    storage = RedisStorage.from_url(server.url, timeout=0.1)
    limit = Limit.concurrency(1, lease=30)
    try:
        first = await storage.decide("k", [Hit(limit)])  # connected, script loaded
        await storage.release(first.leases)
        assert server.proc is not None
        os.kill(server.proc.pid, signal.SIGSTOP)
        try:
            with pytest.raises(StorageError):
                await storage.decide("k", [Hit(limit)])
            await asyncio.sleep(1.5)  # past the grace period: the connection is cut off
        finally:
            os.kill(server.proc.pid, signal.SIGCONT)
        verdicts = []
        for _ in range(20):  # the give-back follows Redis's first answer
            verdicts.append(await storage.decide("k", [Hit(limit)]))
            if verdicts[-1].allowed:
                break
            await asyncio.sleep(0.05)
        assert verdicts[-1].allowed, [v.decisions[0].remaining for v in verdicts]
        assert len(verdicts) <= 2
    finally:
        await storage.close()
        server.stop()


async def test_a_decision_redis_ran_after_its_timeout_charges_its_own_cost_once() -> None:
    """The bound docs/failure.md states: a decision that timed out on the app side but
    that Redis ran later charges its own caller once, its own cost, and nothing more."""
    import os
    import signal

    server = RedisServer()
    server.start()
    storage = RedisStorage.from_url(server.url, timeout=0.1)
    limit = Limit("10/minute")
    try:
        first = await storage.decide("k", [Hit(limit)])
        assert first.decisions[0].remaining == 9
        assert server.proc is not None
        os.kill(server.proc.pid, signal.SIGSTOP)
        try:
            for _ in range(3):  # each sent, then given up on after 0.1 s
                with pytest.raises(StorageError):
                    await storage.decide("k", [Hit(limit, 2)])
        finally:
            os.kill(server.proc.pid, signal.SIGCONT)
        other = await storage.decide("someone-else", [Hit(limit)])
        after = await storage.peek("k", [Hit(limit)])
        assert other.decisions[0].remaining == 9  # nobody else was charged
        assert after.decisions[0].remaining == 9 - 3 * 2  # each undecided one charged once
    finally:
        await storage.close()
        server.stop()


def test_a_cluster_storage_takes_its_timeout() -> None:
    storage = cluster_storage_from_url("redis+cluster://127.0.0.1:7999", timeout=0.5)
    assert (storage.timeout, storage.pipeline) == (0.5, False)


@pytest.mark.parametrize("foreign", [False, True])
async def test_a_sliding_log_reads_its_newest_unit_from_its_name(
    redis_url: str, redis_prefix: str, raw: aioredis.Redis, foreign: bool,
) -> None:
    """The script takes the newest unit's time from its member's name ("<score>:..."); a
    member named otherwise (written by someone else) has its score asked for instead.
    Either way a denial's reset counts from the newest unit and its retry from the
    oldest."""
    clock = FakeClock(1_800_000_000.0)
    storage = on_clock(RedisStorage.from_url(redis_url, prefix=redis_prefix), clock)
    limit = Limit("2/minute", "sliding_log")
    name = redis_key(redis_prefix, "log", "", limit.uid)
    try:
        assert (await storage.decide("log", [Hit(limit)])).allowed
        clock.advance(10)
        if foreign:  # the newest unit, 10 s after the first, under a name of its own
            await raw.zadd(name, {"by-hand": 1_800_000_010_000_000})
        else:
            assert (await storage.decide("log", [Hit(limit)])).allowed
        clock.advance(5)
        denied = (await storage.decide("log", [Hit(limit)])).decisions[0]
        assert not denied.allowed
        assert denied.reset_after == pytest.approx(55)  # the newest leaves at 70 s
        assert denied.retry_after == pytest.approx(45)  # the oldest leaves at 60 s
    finally:
        await storage.close()


async def test_decides_on_the_redis_clock(
    storage: RedisStorage, raw: aioredis.Redis, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A skewed app clock changes nothing: windows follow Redis's TIME."""
    monkeypatch.setattr(time, "time", lambda: 0.0)
    seconds, micros = await raw.time()
    redis_now = seconds + micros / 1e6
    verdict = await storage.decide("clock", [Hit(Limit("5/minute", "fixed_window"))])
    expected = 60 - redis_now % 60
    assert abs(verdict.decisions[0].reset_after - expected) < 0.5
    assert verdict.at is not None and abs(verdict.at - redis_now) < 0.5


@pytest.mark.parametrize("flush", ["FUNCTION", "SCRIPT"])
async def test_reloads_the_script_after_a_flush(
    on_own_redis: tuple[RedisStorage, aioredis.Redis], flush: str,
) -> None:
    """After FUNCTION FLUSH or SCRIPT FLUSH (a restart, a failover) the library and
    scripts are loaded again transparently."""
    storage, raw = on_own_redis
    hit = Hit(Limit("2/minute"))
    assert (await storage.decide("flush", [hit])).allowed
    await raw.execute_command(flush, "FLUSH")
    assert (await storage.decide("flush", [hit])).allowed
    assert not (await storage.decide("flush", [hit])).allowed


@pytest.mark.parametrize("identity", ["ip:2001:db8::1 {x}", "", "}{", "k" * 5000])
def test_keys_share_one_hash_slot(identity: str) -> None:
    """All keys of one identity carry the same hash tag, so Cluster takes them in one call."""
    names = [redis_key("app:", identity, scope, limit.uid)
             for scope in ("", "/a", "/b:{c}")
             for limit in (Limit("1/second"), Limit("9/day", "gcra", burst=3))]
    assert len({key_slot(name.encode()) for name in names}) == 1
    assert len({key_slot(redis_key("app:", f"{identity}{i}", "", "u").encode())
                for i in range(50)}) > 1


@pytest.mark.parametrize(
    ("left", "right"),
    [("a:b", "a%3Ab"), ("", "%"), ("x" * 200, "%~" + "0" * 32), ("a b", "a+b"), ("{", "%7B")],
)
def test_encoded_parts_never_collide(left: str, right: str) -> None:
    """Percent-encoding and hashing are injective: distinct parts give distinct keys."""
    assert encode_part(left) != encode_part(right)
    for part in (left, right):
        assert not {"{", "}", ":", " ", "\n"} & set(encode_part(part))


def test_prefix_with_braces_is_refused() -> None:
    """A prefix holding a brace would break the Cluster hash tag: refused at start-up."""
    with pytest.raises(ConfigError, match="prefix"):
        storage_from_url("redis://127.0.0.1:6379/0", prefix="app{1}:")


@pytest.mark.parametrize("url", [
    "mysql://x", "redis:/nohost", "nonsense", "", "memory:/", "memory://host",
    "memory://?max_keys=-1", "memory://?max_keys=lots", "memory://?maxkeys=5",
    "memory://?max_keys=5&max_keys=6"])
def test_unknown_storage_urls_are_refused(url: str) -> None:
    """An unsupported URL, or one with options memory storage would ignore, is a
    ConfigError naming it (or the bad value)."""
    with pytest.raises(ConfigError, match=r"storage URL|max_keys must be"):
        storage_from_url(url)


async def _nothing(scope: Any, receive: Any, send: Any) -> None:
    """An app the middleware wraps and never calls."""


@pytest.mark.parametrize(("url", "match"), [
    ("redis://127.0.0.1:6379/0?socket_timout=1",
     r"unknown option 'socket_timout' \(did you mean 'socket_timeout'\?\)"),
    ("redis://127.0.0.1:6379/abc", "the database must be a number, got 'abc'"),
    ("redis://127.0.0.1:6379/0?ssl_cert_reqs=none", "unknown option 'ssl_cert_reqs'"),
])
def test_a_redis_url_redis_py_would_misread_is_refused(url: str, match: str) -> None:
    """What redis-py takes silently (a database 'abc' as 0) or fails on only at every
    connect (a mistyped option: the limiter off, failing open) is refused, named, when
    the storage is built: at the middleware's start-up, from the settings too."""
    with pytest.raises(ConfigError, match=match):
        storage_from_url(url)
    with pytest.raises(ConfigError, match=match):
        check_storage_url(url)
    with pytest.raises(ConfigError, match=match):
        RateLimitMiddleware(_nothing, settings=RateLimitSettings(storage_url=url))


def test_redis_py_options_in_a_url_are_taken() -> None:
    """The options redis-py reads from a URL (and TLS ones on rediss://) still pass."""
    for url in ("redis://127.0.0.1/3?socket_timeout=1&client_name=app&health_check_interval=5",
                "rediss://127.0.0.1/0?ssl_cert_reqs=none", "redis://127.0.0.1", "redis://h/"):
        assert isinstance(storage_from_url(url), RedisStorage)
        check_storage_url(url)


@pytest.mark.parametrize("url", [
    "redis://user:s3cret@127.0.0.1:notaport/0", "rediss://u:s3cret@h:99999/0",
    "redis://:s3cret@h/0?socket_timout=1", "mongodb://u:s3cret@h/0"])
def test_a_bad_storage_url_is_named_without_its_password(url: str) -> None:
    """The error names the URL with its password hidden, from the storage and from the
    middleware's start-up (the settings leave such a URL to it: pydantic would quote
    the input beside the message)."""
    with pytest.raises(ConfigError) as raised:
        storage_from_url(url)
    assert "s3cret" not in str(raised.value) and "***" in str(raised.value)
    settings = RateLimitSettings(storage_url=url)
    with pytest.raises(ConfigError) as at_start:
        RateLimitMiddleware(_nothing, settings=settings)
    assert "s3cret" not in str(at_start.value) and "***" in str(at_start.value)


def test_a_memory_url_takes_max_keys() -> None:
    storage = storage_from_url("memory://?max_keys=50")
    assert isinstance(storage, MemoryStorage) and storage.max_keys == 50


async def test_storage_from_url_builds_both_kinds(redis_url: str) -> None:
    """memory:// and redis:// give working storages."""
    memory = storage_from_url("memory://", max_keys=10)
    assert await memory.ping()
    redis_storage = storage_from_url(redis_url)
    try:
        assert isinstance(redis_storage, RedisStorage)
        assert await redis_storage.ping()
    finally:
        await redis_storage.close()


async def test_unreachable_redis_raises_storage_error() -> None:
    """A dead server is a StorageError, quickly, never a raw socket error."""
    from ratelimit_mw import StorageError
    from tests.conftest import free_port

    dead = RedisStorage.from_url(f"redis://127.0.0.1:{free_port()}/0", timeout=0.2)
    try:
        with pytest.raises(StorageError):
            await dead.decide("x", [Hit(Limit("1/second"))])
        assert not await dead.ping()
    finally:
        await dead.close()


async def test_concurrent_decisions_share_one_pipeline(
    redis_url: str, redis_prefix: str,
) -> None:
    """Decisions asked in one event-loop tick go out together, and each gets its answer."""
    writes = Writes()
    storage = recording_storage(redis_url, writes, prefix=redis_prefix)
    hit = Hit(Limit("5/minute", "fixed_window"))
    try:
        await storage.decide("warm", [hit])
        writes.clear()
        verdicts = await asyncio.gather(*(storage.decide(f"p{i % 4}", [hit]) for i in range(40)))
    finally:
        await storage.close()
    assert [len(flush) for flush in writes.flushes()] == [40]
    assert sum(v.allowed for v in verdicts) == 20  # 5 for each of 4 keys
    for i in range(4):
        remaining = sorted(v.decisions[0].remaining for j, v in enumerate(verdicts) if j % 4 == i)
        assert remaining == [0] * 6 + [1, 2, 3, 4]  # 5 admitted (4..0), then 5 denied (0)


@pytest.mark.parametrize("flush", ["FUNCTION", "SCRIPT"])
async def test_a_pipeline_reloads_the_script_after_a_flush(
    on_own_redis: tuple[RedisStorage, aioredis.Redis], flush: str,
) -> None:
    """A missing function (or NOSCRIPT) inside a pipeline loads the library and scripts
    again; every decision still counts."""
    storage, raw = on_own_redis
    hit = Hit(Limit("3/minute", "sliding_log"))
    await storage.decide("warm", [hit])
    await raw.execute_command(flush, "FLUSH")
    verdicts = await asyncio.gather(*(storage.decide("reload", [hit]) for _ in range(10)))
    assert sum(v.allowed for v in verdicts) == 3


async def test_a_failed_pipeline_fails_every_waiter_cleanly() -> None:
    """When Redis is gone, every caller of the batch gets a StorageError."""
    from ratelimit_mw import StorageError
    from tests.conftest import free_port

    dead = RedisStorage.from_url(f"redis://127.0.0.1:{free_port()}/0", timeout=0.2)
    try:
        results = await asyncio.gather(
            *(dead.decide(f"k{i}", [Hit(Limit("1/second"))]) for i in range(5)),
            return_exceptions=True)
        assert all(isinstance(r, StorageError) for r in results), results
    finally:
        await dead.close()


async def test_a_caller_that_gives_up_leaves_the_batch_intact(storage: RedisStorage) -> None:
    """A cancelled waiter (a middleware timeout) does not break its batch-mates."""
    hit = Hit(Limit("100/minute", "fixed_window"))
    tasks = [asyncio.ensure_future(storage.decide("gave-up", [hit])) for _ in range(6)]
    tasks[0].cancel()
    done = await asyncio.gather(*tasks, return_exceptions=True)
    assert isinstance(done[0], asyncio.CancelledError)
    assert all(v.allowed for v in done[1:])  # type: ignore[union-attr]


async def test_releases_ride_in_the_decisions_pipeline(
    redis_url: str, redis_prefix: str,
) -> None:
    """Slots given back in the same tick as other decisions share their round trip."""
    writes = Writes()
    storage = recording_storage(redis_url, writes, prefix=redis_prefix)
    slots = Hit(Limit.concurrency(3))
    try:
        held = [await storage.decide(f"r{i}", [slots]) for i in range(3)]
        writes.clear()
        await asyncio.gather(*(storage.release(v.leases) for v in held),
                             *(storage.decide(f"r{i}", [slots]) for i in range(3)))
        assert writes.flushes() == [[b"ZREM"] * 3 + [b"FCALL"] * 3]
        looked = await asyncio.gather(*(storage.peek(f"r{i}", [slots]) for i in range(3)))
        assert [v.decisions[0].remaining for v in looked] == [2, 2, 2]  # 1 back, 1 taken
    finally:
        await storage.close()


@pytest.mark.parametrize("protocol", [2, 3])
async def test_every_storage_call_works_on_either_protocol(
    redis_url: str, redis_prefix: str, raw: aioredis.Redis, protocol: int,
) -> None:
    """redis-py 8 speaks RESP3 from its first ``HELLO`` unless told otherwise: decisions
    in the pipeline, peeks, slots given back, usage reads and resets answer the same on
    either protocol, and the connections speak the one asked for."""
    name = f"resp{protocol}-{redis_prefix.strip(':')}"
    storage = RedisStorage.from_url(f"{redis_url}?protocol={protocol}&client_name={name}",
                                    prefix=redis_prefix)
    try:
        hits = [*three_limits(), Hit(Limit.concurrency(2))]
        verdicts = await asyncio.gather(*(storage.decide("k", hits, usage=1) for _ in range(3)))
        assert [v.allowed for v in verdicts] == [True, True, False]
        assert [v.decisions[0].remaining for v in verdicts[:2]] == [19, 18]
        await storage.release([lease for v in verdicts for lease in v.leases])
        looked = await storage.peek("k", hits)
        assert [d.remaining for d in looked.decisions] == [18, 998, 98, 2]
        now = time.time()
        assert sum(n for _, n in await storage.usage("k", "day", now - 86400, now + 1)) == 2
        await storage.reset("k")
        assert (await storage.peek("k", hits)).decisions[0].remaining == 20
        clients = await raw.client_list()
        spoke = {int(c["resp"]) for c in clients if c.get("name") == name}
        assert spoke == {protocol}
    finally:
        await storage.close()

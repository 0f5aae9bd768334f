"""Memory and Redis give identical decisions on the same simulated time.

Redis is driven on simulated time through the storage's test-only ``clock`` hook,
which the script takes instead of ``TIME``.
"""

from __future__ import annotations

import random
import time
from typing import NamedTuple

import pytest

from ratelimit_mw import Hit, Limit, MemoryStorage, RedisStorage
from ratelimit_mw.decision import Adjustment, Verdict
from ratelimit_mw.limits import ALGORITHM_NAMES
from tests.conftest import FakeClock, on_clock


def _limits(algorithm: str, rng: random.Random) -> list[Limit]:
    """Three limits of one algorithm with small, varied shapes."""
    made = []
    for _ in range(3):
        amount, period = rng.randint(1, 8), rng.choice([1, 2, 3, 7, 10, 60])
        burst = rng.randint(1, 10) if algorithm in ("token_bucket", "gcra") else None
        made.append(Limit(f"{amount}/{period} seconds", algorithm, burst=burst))
    return made


class Twins(NamedTuple):
    """Memory and Redis storages on one simulated clock, with random limits."""

    rng: random.Random
    clock: FakeClock
    memory: MemoryStorage
    redis: RedisStorage
    limits: list[Limit]


def _twins(redis_url: str, redis_prefix: str, algorithm: str, seed: str) -> Twins:
    """Twins on a clock started at a random time; three limits of ``algorithm`` (of each
    algorithm for ``"mixed"``)."""
    rng = random.Random(seed)
    clock = FakeClock(1_700_000_000 + rng.random() * 1000)
    names = ALGORITHM_NAMES if algorithm == "mixed" else (algorithm,)
    return Twins(rng, clock, MemoryStorage(clock=clock),
                 on_clock(RedisStorage.from_url(redis_url, prefix=redis_prefix), clock),
                 [limit for name in names for limit in _limits(name, rng)])


def _summary(verdict: Verdict) -> tuple[object, ...]:
    return verdict.allowed, tuple(
        (d.allowed, d.quota, d.remaining, d.reset_after, d.retry_after, d.scope)
        for d in verdict.decisions
    )


@pytest.mark.parametrize("algorithm", [*ALGORITHM_NAMES, "mixed"])
@pytest.mark.parametrize("seed", [1, 2])
async def test_memory_and_redis_agree_step_by_step(
    redis_url: str, redis_prefix: str, algorithm: str, seed: int,
) -> None:
    """A thousand random steps (time, keys, costs, several limits) decide identically."""
    rng, clock, memory, redis_storage, limits = _twins(redis_url, redis_prefix, algorithm,
                                                       f"{algorithm}-{seed}")
    try:
        for step in range(1000):
            clock.advance(rng.choice([0, 0, 1e-6, rng.random() * 0.5, rng.random() * 5,
                                      rng.random() * 30]))
            key = rng.choice(["a", "b", "c:{d}"])
            chosen = rng.sample(limits, rng.randint(1, min(4, len(limits))))
            hits = [Hit(limit, rng.choice([0, 1, 1, 1, 2, 3, 9]), rng.choice(["", "/r"]))
                    for limit in chosen]
            if rng.random() < 0.05:
                await memory.reset(key)
                await redis_storage.reset(key)
                continue
            expected = _summary(await memory.decide(key, hits))
            got = _summary(await redis_storage.decide(key, hits))
            assert got == expected, f"step {step} at {clock.now!r}: {hits}"
    finally:
        await redis_storage.close()


@pytest.mark.parametrize("algorithm", ALGORITHM_NAMES)
async def test_memory_and_redis_agree_when_the_clock_steps_back(
    redis_url: str, redis_prefix: str, algorithm: str,
) -> None:
    """The clock stepping back now and then (NTP, a failover to a Redis whose clock is
    behind): the same decisions (a sliding log in memory appended the new units after
    later ones, its log no longer sorted, and over-admitted)."""
    rng, clock, memory, redis_storage, limits = _twins(redis_url, redis_prefix, algorithm,
                                                       f"back-{algorithm}")
    try:
        for step in range(400):
            clock.advance(rng.choice([0, 1e-6, rng.random() * 2, -rng.random() * 3]))
            hits = [Hit(limit, rng.choice([0, 1, 1, 2])) for limit in
                    rng.sample(limits, rng.randint(1, len(limits)))]
            expected = _summary(await memory.decide("k", hits))
            got = _summary(await redis_storage.decide("k", hits))
            assert got == expected, f"step {step} at {clock.now!r}: {hits}"
    finally:
        await redis_storage.close()


async def test_a_sliding_log_counts_units_from_before_the_clock_stepped_back() -> None:
    """2 per 10 s: a unit at 5 s, the clock back to 0 s, a unit then; at 12 s the unit
    from 5 s still counts, so a cost of 2 waits until 15 s."""
    clock = FakeClock(1_700_000_005.0)
    memory = MemoryStorage(clock=clock)
    hit = Hit(Limit("2/10 seconds", "sliding_log"))
    assert (await memory.decide("k", [hit])).allowed
    clock.now -= 5.0
    assert (await memory.decide("k", [hit])).allowed
    clock.now += 12.0
    verdict = await memory.decide("k", [Hit(hit.limit, 2)])
    assert not verdict.allowed
    assert verdict.decisions[0].remaining == 1
    assert verdict.decisions[0].retry_after == pytest.approx(3.0)


async def test_a_token_bucket_denies_at_once_after_the_clock_stepped_back(
    redis_url: str, redis_prefix: str,
) -> None:
    """An empty bucket, the clock 30 s back: the denial and its retry come at once (its
    retry was found a microsecond at a time from the step back: seconds of blocking, and
    on Redis a script past the busy limit)."""
    clock = FakeClock(1_700_000_000.0)
    memory = MemoryStorage(clock=clock)
    redis_storage = on_clock(RedisStorage.from_url(redis_url, prefix=redis_prefix), clock)
    limit = Limit("10/second", "token_bucket")
    try:
        for storage in (memory, redis_storage):
            clock.now = 1_700_000_000.0
            assert (await storage.decide("k", [Hit(limit, 10)])).allowed
            clock.now -= 30.0
            start = time.monotonic()
            verdict = await storage.decide("k", [Hit(limit, 1)])
            assert time.monotonic() - start < 1.0
            assert not verdict.allowed
            assert verdict.decisions[0].retry_after == pytest.approx(30.1)
    finally:
        await redis_storage.close()


async def test_a_huge_sliding_window_finds_its_retry_at_once_and_exactly(
    redis_url: str, redis_prefix: str,
) -> None:
    """1e12 a day (a byte quota, say): after a request of 1 and one of 1e12 - 1 in the
    next window, a denied request's retry time lies where the weighted sum, in floating
    point, stays flat for days of microseconds. It is found by bisection (Redis and the
    memory storage alike, within a moment, not after seconds of stepping a microsecond
    at a time while Redis answers nobody), it is the same on both, and it is exact."""
    clock = FakeClock(1_700_006_400.0)  # a day boundary
    limit = Limit("1000000000000/day", "sliding_window")
    memory = MemoryStorage(clock=clock)
    redis_storage = on_clock(RedisStorage.from_url(redis_url, prefix=redis_prefix), clock)
    try:
        for storage in (memory, redis_storage):
            assert (await storage.decide("k", [Hit(limit, 1)])).allowed
        clock.advance(86_400.0)
        for storage in (memory, redis_storage):
            assert (await storage.decide("k", [Hit(limit, 999_999_999_999)])).allowed
        clock.advance(10.0)
        verdicts = []
        for storage in (memory, redis_storage):
            start = time.monotonic()
            verdicts.append(await storage.decide("k", [Hit(limit, 1)]))
            assert time.monotonic() - start < 1.0
        assert _summary(verdicts[0]) == _summary(verdicts[1])
        assert not verdicts[0].allowed
        # On the microsecond grid the storages count in.
        due = round(clock.now * 1_000_000) + round(verdicts[0].retry_after * 1_000_000)
        clock.now = (due - 1) / 1_000_000
        for storage in (memory, redis_storage):  # a denial consumes nothing
            assert not (await storage.decide("k", [Hit(limit, 1)])).allowed
        clock.now = due / 1_000_000
        for storage in (memory, redis_storage):
            assert (await storage.decide("k", [Hit(limit, 1)])).allowed
    finally:
        await redis_storage.close()


@pytest.mark.parametrize("cost", [499, 500, 501, 4000, 9_999])
async def test_a_sliding_log_takes_a_large_cost_in_one_call(
    redis_url: str, redis_prefix: str, cost: int,
) -> None:
    """A cost of thousands on a sliding log is admitted by Redis as by memory (its
    members go in ZADDs of a few hundred: one of 4000 pairs broke the script halfway,
    after the window limit beside it had already been charged)."""
    clock = FakeClock(1_700_000_000.0)
    limits = [Limit("100000/hour", "fixed_window"), Limit("20000/hour", "sliding_log")]
    memory = MemoryStorage(clock=clock)
    redis_storage = on_clock(RedisStorage.from_url(redis_url, prefix=redis_prefix), clock)
    try:
        for _ in range(2):
            expected = _summary(await memory.decide("k", [Hit(limit, cost) for limit in limits]))
            got = _summary(await redis_storage.decide("k", [Hit(limit, cost) for limit in limits]))
            assert got == expected
            assert got[0]
            clock.advance(1.0)
        peeked = await redis_storage.peek("k", [Hit(limit, 0) for limit in limits])
        assert [d.remaining for d in peeked.decisions] == [100_000 - 2 * cost, 20_000 - 2 * cost]
    finally:
        await redis_storage.close()


@pytest.mark.parametrize(("rate", "burst"), [
    ("300000/second", 5), ("7/second", 3), ("999983/minute", 40),
    ("10000019/day", 10_000_019),  # coarser ticks than the rate's own (see gcra.ticks)
])
async def test_gcra_counts_fractions_of_a_microsecond_alike(
    redis_url: str, redis_prefix: str, rate: str, burst: int,
) -> None:
    """A GCRA whose emission interval is no whole number of microseconds carries the
    fraction in its state: Redis's Lua (in doubles) and memory (in integers) decide
    three hundred steps of such limits identically."""
    rng = random.Random(rate)
    clock = FakeClock(1_700_000_000 + rng.random())
    memory = MemoryStorage(clock=clock)
    redis_storage = on_clock(RedisStorage.from_url(redis_url, prefix=redis_prefix), clock)
    limit = Limit(rate, "gcra", burst=burst)
    interval = limit.period / limit.amount
    try:
        for step in range(300):
            clock.advance(rng.choice([0, 1e-6, interval * rng.random(), interval * 3]))
            hits = [Hit(limit, rng.choice([0, 1, 1, 2, burst // 2, burst + 1]))]
            expected = _summary(await memory.decide("k", hits))
            got = _summary(await redis_storage.decide("k", hits))
            assert got == expected, f"step {step} at {clock.now!r}: {hits}"
    finally:
        await redis_storage.close()


async def test_gcra_with_coarser_ticks_stays_exact_near_its_capacity(
    redis_url: str, redis_prefix: str,
) -> None:
    """A tolerance too long for exact ticks, and a cost just short of the capacity on a
    full bucket: every sum stays exact in Lua's doubles, so Redis and memory agree and
    waiting exactly retry_after admits (the interval rounded up once pushed the sums
    past 2**53, and Redis's wait came a microsecond early)."""
    limit = Limit("494300432/day", "gcra", burst=920165305740)
    rng = random.Random(3)
    for trial in range(30):
        clock = FakeClock(1_700_000_000 + trial * 1000)
        memory = MemoryStorage(clock=clock)
        redis_storage = on_clock(
            RedisStorage.from_url(redis_url, prefix=f"{redis_prefix}{trial}:"), clock)
        try:
            for storage in (memory, redis_storage):
                assert (await storage.decide("k", [Hit(limit, limit.capacity)])).allowed
            clock.advance(rng.randrange(0, 10**6) / 1e6)
            cost = limit.capacity - rng.randrange(0, 10**6)
            start = clock.now
            waits = []
            for storage in (memory, redis_storage):
                clock.now = start
                denied = await storage.decide("k", [Hit(limit, cost)])
                wait = round(denied.retry_after * 1e6)
                clock.now = start + (wait - 1) / 1e6
                assert not (await storage.decide("k", [Hit(limit, cost)])).allowed
                clock.now = start + wait / 1e6
                assert (await storage.decide("k", [Hit(limit, cost)])).allowed
                waits.append(wait)
            assert waits[0] == waits[1]
        finally:
            await redis_storage.close()


async def test_gcra_reads_the_state_earlier_versions_wrote(
    redis_url: str, redis_prefix: str,
) -> None:
    """A TAT stored as whole microseconds (before fractions were kept) still counts, and
    the state written now is one such a version reads."""
    import redis.asyncio as aioredis

    from ratelimit_mw.storage.keys import redis_key

    clock = FakeClock(1_700_000_000.0)
    redis_storage = on_clock(RedisStorage.from_url(redis_url, prefix=redis_prefix), clock)
    raw = aioredis.Redis.from_url(redis_url)
    limit = Limit("1/second", "gcra", burst=2)
    try:
        # Both units taken: the TAT is two seconds ahead.
        await raw.set(redis_key(redis_prefix, "k", "", limit.uid), "1700000002000000")
        verdict = await redis_storage.decide("k", [Hit(limit)])
        assert not verdict.allowed
        assert verdict.retry_after == 1.0
        clock.advance(1.0)
        assert (await redis_storage.decide("k", [Hit(limit)])).allowed
        # What is written now reads as a number of microseconds (what an earlier
        # version, during a rolling deploy, takes it for): the TAT, less than one off.
        stored = await raw.get(redis_key(redis_prefix, "k", "", limit.uid))
        assert abs(float(stored) - (clock.now + 2.0) * 1_000_000) < 1
    finally:
        await redis_storage.close()
        await raw.aclose()


@pytest.mark.parametrize("algorithm", [*ALGORITHM_NAMES, "mixed"])
async def test_memory_and_redis_agree_on_settlements(
    redis_url: str, redis_prefix: str, algorithm: str,
) -> None:
    """Random decisions, some settled later by a random difference (a refund, a higher
    cost, a debt): settle.lua moves Redis's counters as each algorithm's ``settle``
    moves memory's, so every later decision is the same."""
    rng, clock, memory, redis_storage, limits = _twins(redis_url, redis_prefix, algorithm,
                                                       f"settle-{algorithm}")
    reserved: list[tuple[str, Hit, float]] = []
    settled = 0
    try:
        for step in range(600):
            clock.advance(rng.choice([0, 1e-6, rng.random() * 0.5, rng.random() * 3,
                                      rng.random() * 20]))
            if reserved and rng.random() < 0.4:
                key, hit, at = reserved.pop(rng.randrange(len(reserved)))
                adjustment = Adjustment(key, hit, rng.randint(-hit.cost, 6), at)
                await memory.settle([adjustment])
                await redis_storage.settle([adjustment])
                settled += 1
                continue
            key = rng.choice(["a", "b"])
            hits = [Hit(limit, rng.choice([0, 1, 1, 2, 3]))
                    for limit in rng.sample(limits, rng.randint(1, min(3, len(limits))))]
            verdict = await memory.decide(key, hits)
            expected = _summary(verdict)
            got = _summary(await redis_storage.decide(key, hits))
            assert got == expected, f"step {step} at {clock.now!r}: {hits}"
            if verdict.allowed:
                reserved += [(key, hit, verdict.at) for hit in hits]
    finally:
        await redis_storage.close()
    assert settled > 100


@pytest.mark.parametrize("seed", [1, 2])
async def test_memory_and_redis_agree_on_shaped_turns(
    redis_url: str, redis_prefix: str, seed: int,
) -> None:
    """Leaky buckets that hold requests for their turn (``max_delay``), alone and beside
    other limits: the same admissions, waits and refusals on both storages."""
    rng = random.Random(f"shaped-{seed}")
    clock = FakeClock(1_700_000_000 + rng.random() * 1000)
    memory = MemoryStorage(clock=clock)
    redis_storage = on_clock(RedisStorage.from_url(redis_url, prefix=redis_prefix), clock)
    shaped = [Limit(f"{rng.randint(1, 8)}/{rng.choice([1, 2, 7, 60])} seconds", "gcra",
                    max_delay=rng.choice([0.5, 2, 5, 30])) for _ in range(3)]
    limits = [*shaped, *_limits("fixed_window", rng), *_limits("token_bucket", rng)]
    waited = 0
    try:
        for step in range(800):
            clock.advance(rng.choice([0, 1e-6, rng.random() * 0.3, rng.random() * 2,
                                      rng.random() * 10]))
            key = rng.choice(["a", "b"])
            chosen = [rng.choice(shaped), *rng.sample(limits, rng.randint(0, 2))]
            hits = [Hit(limit, rng.choice([0, 1, 1, 1, 2])) for limit in chosen]
            verdict = await memory.decide(key, hits)
            expected = _summary(verdict)
            got = _summary(await redis_storage.decide(key, hits))
            assert got == expected, f"step {step} at {clock.now!r}: {hits}"
            waited += verdict.allowed and any(d.retry_after > 0 for d in verdict.decisions)
    finally:
        await redis_storage.close()
    assert waited > 50

"""Concurrency slots and usage history, taken in the same atomic call as the limits."""

from __future__ import annotations

import random

import pytest

from ratelimit_mw import ConfigError, Hit, Limit, MemoryStorage, RedisStorage, Storage
from ratelimit_mw.storage.base import UsageRetention
from tests.conftest import FakeClock, StorageFactory, on_clock

HOUR, DAY = 3600, 86400


async def test_slots_are_taken_and_given_back(storage: Storage) -> None:
    """Two slots: two requests in flight, the third waits until one is given back."""
    slots = Hit(Limit.concurrency(2, lease=30))
    first = await storage.decide("k", [slots])
    second = await storage.decide("k", [slots])
    third = await storage.decide("k", [slots])
    assert (first.allowed, second.allowed, third.allowed) == (True, True, False)
    assert len(first.leases) == 1 and first.leases[0] != second.leases[0]
    assert third.leases == () and 0 < third.retry_after <= 1
    assert [v.decisions[0].remaining for v in (first, second, third)] == [1, 0, 0]
    await storage.release(first.leases)
    fourth = await storage.decide("k", [slots])
    assert fourth.allowed
    await storage.release(first.leases)  # giving back twice frees nothing more
    assert not (await storage.decide("k", [slots])).allowed


async def test_a_request_takes_one_slot_however_often_the_limit_is_named(
    storage: Storage,
) -> None:
    """One concurrency limit named twice in a decision: one slot taken, one reported
    (it was reported as two, with one lease to give back)."""
    slots = Limit.concurrency(3, lease=30)
    verdict = await storage.decide("k", [Hit(slots), Hit(slots)])
    assert verdict.allowed and len(verdict.leases) == 1
    assert [d.remaining for d in verdict.decisions] == [2]
    assert (await storage.peek("k", [Hit(slots)])).decisions[0].remaining == 2


def test_a_concurrency_hit_costs_one_slot_at_most() -> None:
    """A cost of more than one slot is refused, named: a request holds one."""
    with pytest.raises(ConfigError, match="cost must be 0 or 1, got 2"):
        Hit(Limit.concurrency(3), 2)
    assert Hit(Limit.concurrency(3), 0).cost == 0


@pytest.mark.parametrize("usage", [-1, 10**12 + 1, 10**17, 2**63])
async def test_a_usage_out_of_range_is_refused_and_charges_nothing(
    storage: Storage, usage: object,
) -> None:
    """A usage Redis can't count is refused before anything is charged (Redis used to
    charge the limits, then fail on the usage buckets)."""
    limit = Limit("5/minute")
    with pytest.raises(ConfigError, match="usage must be a whole number of units"):
        await storage.decide("k", [Hit(limit)], usage=usage)
    assert (await storage.peek("k", [Hit(limit)])).decisions[0].remaining == 5
    assert sum(n for _, n in await storage.usage("k", "hour", 0, 2**40)) == 0


async def test_a_lease_expires_if_never_given_back(storage: Storage, clock: FakeClock) -> None:
    """A worker that died holds its slot no longer than the lease."""
    slots = Hit(Limit.concurrency(1, lease=5))
    assert (await storage.decide("k", [slots])).allowed
    clock.advance(4.9)
    assert not (await storage.decide("k", [slots])).allowed
    clock.advance(0.2)
    assert (await storage.decide("k", [slots])).allowed


async def test_full_slots_consume_no_rate_and_denied_rates_take_no_slot(storage: Storage) -> None:
    """Slots and rate limits are all-or-nothing together."""
    slots = Hit(Limit.concurrency(1))
    rate = Hit(Limit("2/minute", "fixed_window"))
    held = await storage.decide("k", [rate, slots])
    assert held.allowed
    assert not (await storage.decide("k", [rate, slots])).allowed  # slot full
    assert (await storage.peek("k", [rate])).decisions[0].remaining == 1
    await storage.release(held.leases)
    assert (await storage.decide("k", [rate, slots])).allowed
    await storage.release((await storage.decide("other", [slots])).leases)
    empty = await storage.decide("k", [rate, slots])  # rate exhausted, slot busy anyway
    assert not empty.allowed and empty.leases == ()


async def test_peek_reports_slots_in_use(storage: Storage) -> None:
    """A look at a concurrency limit tells how many slots are free."""
    slots = Hit(Limit.concurrency(3))
    await storage.decide("k", [slots])
    looked = await storage.peek("k", [slots])
    assert looked.allowed and looked.decisions[0].remaining == 2 and looked.leases == ()


async def test_usage_counts_admitted_requests_per_hour_and_day(
    storage: Storage, clock: FakeClock,
) -> None:
    """History buckets add up to the admitted requests; denials are not counted."""
    clock.now = 1_800_000_000 - 1_800_000_000 % DAY  # midnight UTC, in the future
    start = clock.now
    limit = Hit(Limit("1000/day", "fixed_window"))
    tight = Hit(Limit("3/hour", "fixed_window"), scope="tight")
    made = {0: 2, 1: 3, 5: 1}
    for hour, count in made.items():
        clock.now = start + hour * HOUR + 60
        for _ in range(count):
            assert (await storage.decide("user", [limit], usage=True)).allowed
    clock.now = start + 5 * HOUR + 120
    for _ in range(4):
        await storage.decide("user", [limit, tight], usage=True)  # 3 admitted, 1 denied
    await storage.decide("user", [limit])  # not counted: usage not asked for
    hours = await storage.usage("user", "hour", start, start + 6 * HOUR - 1)
    assert hours == [(int(start) + h * HOUR, made.get(h, 0) + (3 if h == 5 else 0))
                     for h in range(6)]
    days = await storage.usage("user", "day", start - DAY, start + DAY - 1)
    assert days == [(int(start) - DAY, 0), (int(start), 9)]
    assert await storage.usage("nobody", "day", start, start) == [(int(start), 0)]


async def test_usage_keeps_only_its_retention(
    make_storage: StorageFactory, clock: FakeClock,
) -> None:
    """Buckets older than the retention are not reported."""
    storage = make_storage(clock=clock, usage_retention=UsageRetention(hours=2, days=3))
    clock.now = 1_800_000_000 - 1_800_000_000 % DAY
    start = clock.now
    for hour in range(5):
        clock.now = start + hour * HOUR
        await storage.decide("u", [], usage=True)
    hours = await storage.usage("u", "hour", start, start + 10 * HOUR)
    assert hours == [(int(start) + 3 * HOUR, 1), (int(start) + 4 * HOUR, 1)]


async def test_bad_granularity_is_refused(storage: Storage) -> None:
    """Only hour and day buckets exist."""
    from ratelimit_mw import ConfigError

    with pytest.raises(ConfigError, match="granularity"):
        await storage.usage("u", "week", 0, 1)  # type: ignore[arg-type]


@pytest.mark.parametrize("seed", [1, 2, 3])
async def test_slots_agree_on_memory_and_redis(
    redis_url: str, redis_prefix: str, seed: int,
) -> None:
    """Random acquires, releases and time steps decide identically on both storages."""
    rng = random.Random(seed)
    clock = FakeClock(1_800_000_000.0)
    memory = MemoryStorage(clock=clock)
    redis_storage = on_clock(RedisStorage.from_url(redis_url, prefix=redis_prefix), clock)
    slots = Hit(Limit.concurrency(3, lease=2))
    rate = Hit(Limit("20/10 seconds", "sliding_window"))
    held: list[tuple[object, object]] = []
    try:
        for step in range(400):
            clock.advance(rng.choice([0, 0.01, 0.3, 1.5]))
            if held and rng.random() < 0.4:
                mine, theirs = held.pop(rng.randrange(len(held)))
                await memory.release(mine)  # type: ignore[arg-type]
                await redis_storage.release(theirs)  # type: ignore[arg-type]
                continue
            hits = [slots, rate] if rng.random() < 0.5 else [slots]
            a, b = await memory.decide("k", hits), await redis_storage.decide("k", hits)
            assert (a.allowed, a.decisions) == (b.allowed, b.decisions), f"step {step}"
            if a.allowed:
                held.append((a.leases, b.leases))
    finally:
        await redis_storage.close()


async def test_leases_expire_in_order_when_the_clock_went_back(clock: FakeClock) -> None:
    """A wall clock stepped back gives a new lease an earlier expiry than older ones; each
    still expires on its own time, and giving one back frees exactly that one."""
    storage = MemoryStorage(clock=clock)
    slots = Hit(Limit.concurrency(3, lease=10))
    first = await storage.decide("k", [slots])
    clock.advance(-5)
    second = await storage.decide("k", [slots])  # expires 5 s before the first
    assert first.allowed and second.allowed
    clock.advance(10.5)  # past the second's lease, not the first's
    view = await storage.peek("k", [slots])
    assert view.decisions[0].remaining == 2
    await storage.release(first.leases)
    assert (await storage.peek("k", [slots])).decisions[0].remaining == 3


@pytest.mark.redis
async def test_redis_usage_buckets_expire_after_their_retention(
    redis_url: str, redis_prefix: str,
) -> None:
    """Each usage bucket gets its time to live when it is created (end of the bucket plus
    the retention), and keeps it while requests count into it."""
    storage = RedisStorage.from_url(redis_url, prefix=redis_prefix,
                                    usage_retention=UsageRetention(hours=2, days=3))
    try:
        for _ in range(3):
            assert (await storage.decide("u", [], usage=True)).allowed
        raw = storage.client
        ttls = {}
        for kind in ("h", "d"):
            names = [name async for name in raw.scan_iter(match=f"{redis_prefix}*u:{kind}:*")]
            assert len(names) == 1
            assert int(await raw.get(names[0])) == 3
            ttls[kind] = await raw.pttl(names[0])
        assert 1 * HOUR * 1000 < ttls["h"] <= 2 * HOUR * 1000 + 1000
        assert 2 * DAY * 1000 < ttls["d"] <= 3 * DAY * 1000 + 1000
    finally:
        await storage.close()

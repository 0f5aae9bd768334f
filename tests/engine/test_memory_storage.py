"""What only the in-memory storage promises: bounded memory, reclaimed state."""

from __future__ import annotations

import gc

import pytest

from ratelimit_mw import ConfigError, Hit, Limit, MemoryStorage
from ratelimit_mw.limits import ALGORITHM_NAMES
from ratelimit_mw.storage.base import UsageRetention
from tests.conftest import FakeClock


async def test_max_keys_evicts_the_least_recently_used(clock: FakeClock) -> None:
    """Beyond max_keys the coldest identity goes; a hot one stays."""
    storage = MemoryStorage(max_keys=100, clock=clock)
    hit = Hit(Limit("1/hour", "fixed_window"))
    await storage.decide("hot", [hit])
    for i in range(1000):
        await storage.decide(f"flood-{i}", [hit])
        if i % 10 == 0:
            await storage.decide("hot", [Hit(hit.limit, 0)])  # touched, so kept
    assert len(storage) == 100
    assert not (await storage.decide("hot", [hit])).allowed  # its usage survived
    assert (await storage.decide("flood-0", [hit])).allowed  # evicted, so forgotten


async def test_expired_state_is_reclaimed(clock: FakeClock) -> None:
    """Identities whose counters have all expired are dropped as new ones arrive."""
    storage = MemoryStorage(clock=clock)
    hit = Hit(Limit("5/second", "sliding_log"))
    for i in range(50):
        await storage.decide(f"old-{i}", [hit])
    assert len(storage) == 50
    clock.advance(1.0)
    for i in range(20):
        await storage.decide(f"new-{i}", [hit])
    assert len(storage) == 20


async def test_denied_and_peeked_requests_store_nothing(clock: FakeClock) -> None:
    """Only admitted requests with a cost create state."""
    storage = MemoryStorage(clock=clock)
    limit = Limit("1/minute")
    await storage.peek("peeker", [Hit(limit)])
    await storage.decide("never", [Hit(limit, 5)])
    assert len(storage) == 0


@pytest.mark.parametrize("max_keys", [0, -1, 1.5, True])
def test_max_keys_must_be_positive(max_keys: object) -> None:
    """A max_keys that cannot hold a key is refused at start-up."""
    with pytest.raises(ConfigError, match="max_keys"):
        MemoryStorage(max_keys=max_keys)  # type: ignore[arg-type]


def test_repr_shows_live_state() -> None:
    """repr tells how full the storage is."""
    assert repr(MemoryStorage(max_keys=7)) == "MemoryStorage(keys=0, max_keys=7)"


async def test_hourly_history_kept_longer_than_the_daily_one_survives() -> None:
    """With more hours kept than days (48 hours, 1 day), a caller's hourly buckets stay
    for their own retention: the caller is not forgotten when its daily one ends (as
    Redis keeps each bucket for its own)."""
    from ratelimit_mw.storage.base import UsageRetention

    midnight = 1_800_000_000 - 1_800_000_000 % 86400
    clock = FakeClock(midnight + 10 * 3600.0)
    storage = MemoryStorage(clock=clock, usage_retention=UsageRetention(hours=48, days=1))
    await storage.decide("alice", [], usage=True)
    clock.now += 26 * 3600  # the next day, 12:00: alice's daily retention is over
    for i in range(40):  # newcomers make the storage reclaim expired identities
        await storage.decide(f"newcomer-{i}", [], usage=True)
    hour = midnight + 10 * 3600
    assert await storage.usage("alice", "hour", hour - 3600, hour + 3600) == [
        (hour - 3600, 0), (hour, 1), (hour + 3600, 0)]


async def test_usage_history_stays_within_its_retention() -> None:
    """A key counted for weeks keeps no more hourly and daily buckets than the retention
    (memory stays bounded), and still reports the newest ones exactly."""
    clock = FakeClock(1_800_000_000.0 - 1_800_000_000 % 86400)
    storage = MemoryStorage(clock=clock, usage_retention=UsageRetention(hours=5, days=3))
    start = clock.now
    for hour in range(24 * 20):
        clock.now = start + hour * 3600
        await storage.decide("k", [], usage=True)
    hours, days = storage._histories._by_key["k"]
    assert len(hours) <= 5 and len(days) <= 3
    newest = int(clock.now) - int(clock.now) % 3600
    assert (await storage.usage("k", "hour", newest, newest))[0] == (newest, 1)
    today = int(clock.now) - int(clock.now) % 86400
    assert (await storage.usage("k", "day", today, today))[0] == (today, 24)


async def test_an_evicted_or_reclaimed_identity_takes_its_history_along(
    clock: FakeClock,
) -> None:
    """Usage histories are kept beside the counters: evicting an identity (max_keys) or
    reclaiming it (expired) forgets its history too, so neither grows without bound."""
    storage = MemoryStorage(max_keys=10, clock=clock,
                            usage_retention=UsageRetention(hours=1, days=1))
    hit = Hit(Limit("5/second"))
    for i in range(100):
        await storage.decide(f"flood-{i}", [hit], usage=1)
    assert len(storage) == len(storage._histories) == 10
    assert await storage.usage("flood-0", "hour", clock.now, clock.now) == [
        (int(clock.now) - int(clock.now) % 3600, 0)]
    clock.advance(2 * 86400)  # counters and histories expired
    for i in range(10):
        await storage.decide(f"new-{i}", [hit])
    assert len(storage._histories) == 0


@pytest.mark.parametrize("algorithm", [*ALGORITHM_NAMES, "calendar_month"])
@pytest.mark.parametrize("usage", [0, 1])
def test_the_collector_lets_go_of_identities_in_their_first_collection(
    algorithm: str, usage: int,
) -> None:
    """Every identity's entry is untracked by the first (youngest) collection after its
    decision, one limit or two, with a usage history or not: a million identities add
    nothing for older collections to traverse again. (Concurrency slots, short-lived,
    are not counted here.)"""
    storage = MemoryStorage()
    one = [Hit(Limit("100/month" if algorithm == "calendar_month" else "100/minute",
                     algorithm))]
    two = [*one, Hit(Limit("1000/day", "fixed_window"), 1, "/route")]
    gc.collect()  # the limits made at start-up, long before the requests
    for i in range(300):
        storage.decide_now(f"c{i}", one if i % 2 else two, usage)
        storage.decide_now(f"c{i // 2}", one, usage)  # an entry replaced
    gc.collect(0)
    tracked = [key for key, entry in storage._keys.items() if gc.is_tracked(entry)]
    assert tracked == []


@pytest.mark.parametrize("algorithm", ["fixed_window", "sliding_window", "calendar_month"])
def test_identities_in_one_window_share_its_numbers(algorithm: str) -> None:
    """Every identity counted in the same window holds the same objects for the window's
    start and edge, rather than two numbers of its own (64 bytes an identity)."""
    storage = MemoryStorage()
    hit = Hit(Limit("100/month" if algorithm == "calendar_month" else "100/hour", algorithm))
    for key in ("a", "b", "c"):
        storage.decide_now(key, [hit])
    a, b, c = (storage._keys[key] for key in "abc")
    assert a == b == c  # the same counts, the same window
    for i in range(len(a)):
        assert a[i] is b[i] is c[i] or (isinstance(a[i], int) and -5 <= a[i] <= 256), i


async def test_hits_out_of_their_counters_order_keep_every_count(clock: FakeClock) -> None:
    """A request naming an identity's counters in another order than they were first
    kept (a route's limits before its tier's, a new one among them) counts on each of
    its own counters, leaves the others alone, and gets its slots in its hits' order."""
    storage = MemoryStorage(clock=clock)
    a, b, c = (Limit(f"{n}/minute", "fixed_window") for n in (10, 20, 30))
    slots = Limit("5/minute", "concurrency"), Limit("6/minute", "concurrency")
    await storage.decide("k", [Hit(a), Hit(b), Hit(slots[0])])
    verdict = await storage.decide("k", [Hit(slots[1]), Hit(c), Hit(slots[0]), Hit(a)])
    assert verdict.allowed
    assert [lease.uid for lease in verdict.leases] == [slots[1].uid, slots[0].uid]
    peek = await storage.decide("k", [Hit(limit, 0) for limit in (a, b, c, *slots)])
    assert [d.remaining for d in peek.decisions] == [8, 19, 29, 3, 5]

"""Monthly quotas that reset on the 1st of each UTC month."""

from __future__ import annotations

import random
from datetime import UTC, datetime

import pytest

from ratelimit_mw import ConfigError, Hit, Limit, MemoryStorage, RedisStorage, Storage
from ratelimit_mw.algorithms.calendar_month import month_bounds
from ratelimit_mw.decision import Adjustment
from tests.conftest import FakeClock, on_clock


def ts(text: str) -> float:
    return datetime.fromisoformat(text).replace(tzinfo=UTC).timestamp()


@pytest.mark.parametrize(
    ("moment", "start", "end"),
    [("2024-01-31T23:59:59", "2024-01-01", "2024-02-01"),
     ("2024-02-29T12:00:00", "2024-02-01", "2024-03-01"),  # leap day
     ("2023-02-28T12:00:00", "2023-02-01", "2023-03-01"),
     ("2026-12-15T00:00:00", "2026-12-01", "2027-01-01"),
     ("2027-01-01T00:00:00", "2027-01-01", "2027-02-01")],
)
def test_month_bounds_follow_the_calendar(moment: str, start: str, end: str) -> None:
    """The window runs from the 1st of the UTC month to the 1st of the next."""
    assert month_bounds(round(ts(moment) * 1e6)) == (round(ts(start) * 1e6), round(ts(end) * 1e6))


async def test_quota_resets_on_the_first(storage: Storage, clock: FakeClock) -> None:
    """3/month: used up on Jan 31, back in full at Feb 1 00:00, retry_after pointing there."""
    monthly = Hit(Limit.monthly(3))
    clock.now = ts("2027-01-31T23:00:00")
    for _ in range(3):
        assert (await storage.decide("acct", [monthly])).allowed
    denied = await storage.decide("acct", [monthly])
    assert not denied.allowed and denied.retry_after == 3600
    clock.now = ts("2027-02-01T00:00:00")
    again = await storage.decide("acct", [monthly])
    assert again.allowed and again.decisions[0].remaining == 2
    assert again.decisions[0].reset_after == 28 * 86400


def test_monthly_rate_must_say_month() -> None:
    """calendar_month with a non-monthly rate is refused with the fix in the message."""
    with pytest.raises(ConfigError, match="'5/month'"):
        Limit("5/day", "calendar_month")
    assert Limit("5/month", "calendar_month").uid == Limit.monthly(5).uid


async def test_memory_and_redis_agree_across_months(redis_url: str, redis_prefix: str) -> None:
    """Random steps over two years of month edges, some settled later by a random
    difference, decide identically on both storages."""
    rng = random.Random(7)
    clock = FakeClock(ts("2027-11-30T20:00:00"))
    memory = MemoryStorage(clock=clock)
    redis_storage = on_clock(RedisStorage.from_url(redis_url, prefix=redis_prefix), clock)
    hits = [Hit(Limit.monthly(5)), Hit(Limit("3/day", "fixed_window"))]
    reserved: list[Adjustment] = []
    try:
        for step in range(500):
            clock.advance(rng.choice([1, 3600, 6 * 3600, 2 * 86400]))
            if reserved and rng.random() < 0.3:  # settled later, maybe in the next month
                adjustment = reserved.pop(rng.randrange(len(reserved)))
                adjustment = adjustment._replace(delta=rng.randint(-1, 3))
                await memory.settle([adjustment])
                await redis_storage.settle([adjustment])
                continue
            chosen = rng.sample(hits, rng.randint(1, 2))
            a, b = await memory.decide("k", chosen), await redis_storage.decide("k", chosen)
            assert a == b, f"step {step} at {clock.now}"
            if a.allowed:
                reserved += [Adjustment("k", hit, 0, a.at) for hit in chosen]
    finally:
        await redis_storage.close()

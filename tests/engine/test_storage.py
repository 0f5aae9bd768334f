"""Every storage passes the same cases: memory and real Redis (the storage matrix)."""

from __future__ import annotations

import asyncio

import pytest

from ratelimit_mw import Hit, Limit, MemoryStorage, Storage
from ratelimit_mw.decision import NEVER
from ratelimit_mw.limits import ALGORITHM_NAMES
from tests.conftest import FakeClock, StorageFactory


def limit_for(algorithm: str, rate: str = "3/minute") -> Limit:
    """A limit of ``rate``; the bucket algorithms get a burst equal to the amount."""
    burst = int(rate.split("/")[0]) if algorithm in ("token_bucket", "gcra") else None
    return Limit(rate, algorithm, burst=burst)


@pytest.mark.parametrize("algorithm", ALGORITHM_NAMES)
async def test_admits_up_to_the_limit_then_denies(storage: Storage, algorithm: str) -> None:
    """Three of 3/minute pass, the fourth is denied with a positive retry_after."""
    hit = Hit(limit_for(algorithm))
    verdicts = [await storage.decide("alice", [hit]) for _ in range(4)]
    assert [v.allowed for v in verdicts] == [True, True, True, False]
    assert [v.decisions[0].remaining for v in verdicts] == [2, 1, 0, 0]
    assert verdicts[3].retry_after > 0
    assert verdicts[3].decisions[0].quota == 3


@pytest.mark.parametrize("algorithm", ALGORITHM_NAMES)
async def test_waiting_retry_after_is_enough(
    storage: Storage, clock: FakeClock, algorithm: str,
) -> None:
    """A client that waits exactly retry_after is admitted."""
    hit = Hit(limit_for(algorithm))
    for _ in range(3):
        await storage.decide("bob", [hit])
    denied = await storage.decide("bob", [hit])
    assert not denied.allowed
    clock.advance(denied.retry_after)
    assert (await storage.decide("bob", [hit])).allowed


async def test_keys_are_independent(storage: Storage) -> None:
    """One identity's usage does not touch another's."""
    hit = Hit(Limit("1/minute"))
    assert (await storage.decide("a", [hit])).allowed
    assert not (await storage.decide("a", [hit])).allowed
    assert (await storage.decide("b", [hit])).allowed


async def test_scopes_are_independent(storage: Storage) -> None:
    """The same limit in two scopes (two routes) counts separately."""
    limit = Limit("1/minute")
    assert (await storage.decide("a", [Hit(limit, scope="/x")])).allowed
    assert (await storage.decide("a", [Hit(limit, scope="/y")])).allowed
    assert not (await storage.decide("a", [Hit(limit, scope="/x")])).allowed


@pytest.mark.parametrize("algorithm", ALGORITHM_NAMES)
async def test_a_denied_request_consumes_nothing(storage: Storage, algorithm: str) -> None:
    """When one limit denies, the others keep every unit they had."""
    roomy = Hit(limit_for(algorithm, "10/minute"))
    tight = Hit(Limit("1/minute", "fixed_window"), scope="tight")
    assert (await storage.decide("carol", [roomy, tight])).allowed
    for _ in range(5):
        denied = await storage.decide("carol", [roomy, tight])
        assert not denied.allowed
        assert denied.decisions[0].allowed and denied.decisions[0].remaining == 9
    assert (await storage.peek("carol", [roomy])).decisions[0].remaining == 9


async def test_all_limits_decided_together(storage: Storage) -> None:
    """A burst bucket plus a daily window: the tighter one binds and is reported."""
    burst = Hit(Limit("10/minute", "token_bucket", burst=20))
    daily = Hit(Limit("25/day", "fixed_window"))
    results = [await storage.decide("dave", [burst, daily]) for _ in range(21)]
    assert sum(v.allowed for v in results) == 20
    last = results[-1]
    assert last.binding is not None and last.binding.limit == burst.limit
    assert [d.remaining for d in last.decisions] == [0, 5]


async def test_cost_counts_units(storage: Storage) -> None:
    """A cost of 5 uses five units; a cost over the limit is denied for ever."""
    limit = Limit("10/minute", "sliding_log")
    assert (await storage.decide("erin", [Hit(limit, 5)])).decisions[0].remaining == 5
    never = await storage.decide("erin", [Hit(limit, 11)])
    assert not never.allowed and never.retry_after == NEVER and never.decisions[0].never
    assert (await storage.decide("erin", [Hit(limit, 5)])).allowed


async def test_peek_consumes_nothing(storage: Storage) -> None:
    """peek reports usage and never changes it."""
    limit = Limit("2/minute", "gcra", burst=2)
    await storage.decide("fay", [Hit(limit)])
    for _ in range(3):
        looked = await storage.peek("fay", [Hit(limit)])
        assert looked.allowed and looked.decisions[0].remaining == 1
    assert (await storage.decide("fay", [Hit(limit)])).allowed


async def test_reset_forgets_a_key(storage: Storage) -> None:
    """reset restores the full quota of one identity and no other."""
    hit = Hit(Limit("1/minute", "fixed_window"))
    await storage.decide("gus", [hit])
    await storage.decide("hal", [hit])
    await storage.reset("gus")
    assert (await storage.decide("gus", [hit])).allowed
    assert not (await storage.decide("hal", [hit])).allowed


async def test_the_same_counter_twice_is_counted_twice(storage: Storage) -> None:
    """Two hits on one counter in one call consume from one state."""
    limit = Limit("3/minute", "fixed_window")
    verdict = await storage.decide("ivy", [Hit(limit), Hit(limit)])
    assert verdict.allowed and verdict.decisions[0].remaining == 1
    assert not (await storage.decide("ivy", [Hit(limit), Hit(limit)])).allowed


@pytest.mark.parametrize(
    "key",
    ["a:b", "a{b}c", "{", "}", "", " ", "line\nbreak", "x" * 10_000, "ünïcødé", "\udcff",
     "%~" + "0" * 32, "*", "[a-z]?", "\\"],
)
async def test_odd_keys_are_kept_apart(storage: Storage, key: str) -> None:
    """Keys with separators, braces, glob characters or 10 kB of text work and never collide."""
    hit = Hit(Limit("1/minute", "fixed_window"))
    assert (await storage.decide(key, [hit])).allowed
    assert not (await storage.decide(key, [hit])).allowed
    assert (await storage.decide(key + "-other", [hit])).allowed
    assert (await storage.decide("neighbour", [hit])).allowed
    await storage.reset(key)
    assert (await storage.decide(key, [hit])).allowed
    assert not (await storage.decide(key + "-other", [hit])).allowed


@pytest.mark.parametrize("algorithm", ALGORITHM_NAMES)
async def test_concurrent_decisions_admit_exactly_the_limit(
    make_storage: StorageFactory, algorithm: str,
) -> None:
    """1000 concurrent decisions on a limit of 100 admit exactly 100 (Redis: 50 connections)."""
    storage = make_storage(max_connections=50) if _is_redis(make_storage) else make_storage()
    hit = Hit(limit_for(algorithm, "100/hour"))
    verdicts = await asyncio.gather(*(storage.decide("crowd", [hit]) for _ in range(1000)))
    assert sum(v.allowed for v in verdicts) == 100


def _is_redis(make_storage: StorageFactory) -> bool:
    probe = make_storage()
    return not isinstance(probe, MemoryStorage)


async def test_many_limits_in_one_call(storage: Storage) -> None:
    """Five algorithms at once are decided and reported in order."""
    hits = [Hit(limit_for(name, "4/minute")) for name in ALGORITHM_NAMES]
    verdict = await storage.decide("mix", hits)
    assert verdict.allowed
    assert [d.limit.algorithm for d in verdict.decisions] == list(ALGORITHM_NAMES)
    assert {d.remaining for d in verdict.decisions} == {3}


async def test_no_hits_is_allowed(storage: Storage) -> None:
    """A request with no limits is admitted with no decisions."""
    verdict = await storage.decide("nobody", [])
    assert verdict.allowed and verdict.decisions == () and verdict.binding is None


async def test_verdicts_carry_the_storage_clock(storage: Storage, clock: FakeClock) -> None:
    """Verdict.at is the time the storage decided on (Redis: its own clock)."""
    verdict = await storage.decide("clock", [Hit(Limit("1/minute"))])
    assert verdict.at is not None and abs(verdict.at - clock.now) < 1e-3

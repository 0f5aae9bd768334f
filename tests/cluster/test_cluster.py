"""What Redis Cluster adds: one slot per decision, exactness across nodes, moving slots.

The storage-matrix cases run on Cluster too (test_storage_matrix.py); these are the
cases only a cluster has. Some move slots between the nodes of the session's cluster:
every other test finds its keys wherever they are, so the order does not matter.
"""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import time
from collections.abc import AsyncIterator, Awaitable

import pytest

from ratelimit_mw import Hit, Limit, RedisStorage, StorageError
from ratelimit_mw.decision import Verdict
from ratelimit_mw.limits import ALGORITHM_NAMES
from ratelimit_mw.storage.keys import redis_key
from tests.engine.test_storage import limit_for
from tests.redis_servers import ClusterDeployment, RedisProcess, StorageFactory, storage_factory

# The session's deployment takes seconds to start: not in the quick loop.
pytestmark = pytest.mark.slow


@pytest.fixture
async def make(redis_cluster_url: str) -> AsyncIterator[StorageFactory]:
    async with storage_factory(redis_cluster_url) as factory:
        yield factory


@pytest.fixture
def storage(make: StorageFactory) -> RedisStorage:
    made = make()
    assert isinstance(made, RedisStorage)
    return made


async def outcome(call: Awaitable[Verdict]) -> Verdict | StorageError:
    """The verdict, or the StorageError; any other exception fails the test."""
    try:
        return await call
    except StorageError as exc:
        return exc


def other_node(cluster: ClusterDeployment, slot: int) -> int:
    """The index of a node that does not serve ``slot`` now."""
    owner = cluster.owner(slot)
    return next(i for i, node in enumerate(cluster.nodes) if node is not owner)


async def test_every_key_of_a_decision_is_in_one_slot(
    storage: RedisStorage, redis_cluster: ClusterDeployment,
) -> None:
    """Five algorithms in two scopes: ten keys, one hash slot, all on that slot's node."""
    hits = [Hit(limit_for(name, "5/minute"), scope=scope)
            for name in ALGORITHM_NAMES for scope in ("", "/orders:{x}")]
    assert (await storage.decide("ip:2001:db8::7", hits)).allowed
    found = {node.port: node.call("KEYS", storage.prefix + "*") for node in redis_cluster.nodes}
    holders = {port: names for port, names in found.items() if names}
    assert len(holders) == 1
    (names,) = holders.values()
    assert len(names) == len(hits)
    slots = {redis_cluster.nodes[0].call("CLUSTER", "KEYSLOT", name) for name in names}
    assert len(slots) == 1
    assert redis_cluster.owner(slots.pop()).port in holders


@pytest.mark.parametrize("algorithm", ALGORITHM_NAMES)
async def test_concurrent_decisions_on_every_node_are_exact(
    make: StorageFactory, redis_cluster: ClusterDeployment, algorithm: str,
) -> None:
    """1000 concurrent decisions, 250 for each of four identities on three nodes: 100 each."""
    storage = make(max_connections=20)
    identities = ["a", "b", "c", "d"]
    assert len({redis_cluster.owner(ClusterDeployment.slot(redis_key("p:", who, "", "u")))
                .port for who in identities}) == 3
    hit = Hit(limit_for(algorithm, "100/hour"))
    verdicts = await asyncio.gather(*(storage.decide(who, [hit])
                                      for _ in range(250) for who in identities))
    admitted = {who: sum(v.allowed for v in verdicts[i::4]) for i, who in enumerate(identities)}
    assert admitted == dict.fromkeys(identities, 100)


@pytest.mark.parametrize("flush", ["FUNCTION", "SCRIPT"])
async def test_noscript_on_fresh_nodes_reloads_the_script(
    storage: RedisStorage, redis_cluster: ClusterDeployment, flush: str,
) -> None:
    """After FUNCTION FLUSH or SCRIPT FLUSH on every node (a restart, a new node)
    decisions go on, exactly."""
    hit = Hit(Limit("3/minute", "sliding_log"))
    assert (await storage.decide(f"flushed-{flush}", [hit])).allowed
    for node in redis_cluster.nodes:
        node.call(flush, "FLUSH")
    remaining = [(await storage.decide(f"flushed-{flush}", [hit])).decisions[0].remaining
                 for _ in range(3)]
    assert remaining == [1, 0, 0]


async def test_a_moved_slot_is_followed_transparently(
    storage: RedisStorage, redis_cluster: ClusterDeployment,
) -> None:
    """Resharding the slot of a key (MOVED) changes nothing for the caller, counts included."""
    hit = Hit(Limit("5/minute", "fixed_window"))
    for _ in range(2):
        await storage.decide("mover", [hit])
    slot = ClusterDeployment.slot(redis_key(storage.prefix, "mover", "", hit.limit.uid))
    target = redis_cluster.nodes[other_node(redis_cluster, slot)]
    redis_cluster.move_slot(slot, target)
    assert redis_cluster.owner(slot) is target
    remaining = [(await storage.decide("mover", [hit])).decisions[0].remaining for _ in range(4)]
    assert remaining == [2, 1, 0, 0]


async def test_a_slot_in_migration_is_followed_through_ask(
    storage: RedisStorage, redis_cluster: ClusterDeployment,
) -> None:
    """While a slot migrates (keys already moved: ASK) decisions still count exactly."""
    hit = Hit(Limit("4/minute", "gcra", burst=4))
    await storage.decide("asker", [hit])
    slot = ClusterDeployment.slot(redis_key(storage.prefix, "asker", "", hit.limit.uid))
    target = redis_cluster.nodes[other_node(redis_cluster, slot)]
    redis_cluster.begin_moving(slot, target)
    try:
        assert (await storage.decide("asker", [hit])).decisions[0].remaining == 2
    finally:
        redis_cluster.finish_moving(slot, target)
    assert (await storage.decide("asker", [hit])).decisions[0].remaining == 1


async def test_usage_history_does_not_stop_a_migrating_slots_decisions(
    storage: RedisStorage, redis_cluster: ClusterDeployment,
) -> None:
    """With usage history on, a decision's declared keys are its counters only (the
    usage buckets share their slot): while the slot migrates, a caller whose counters
    exist decides, keys on the source and keys moved alike. (The never-existing usage
    prefix was declared too: Redis answered TRYAGAIN until the slot had moved.)"""
    hits = [Hit(Limit("100/minute", "fixed_window")), Hit(Limit("1000/day"))]
    assert (await storage.decide("historian", hits, usage=True)).allowed
    slot = ClusterDeployment.slot(redis_key(storage.prefix, "historian", "", "u"))
    target = redis_cluster.nodes[other_node(redis_cluster, slot)]
    source = redis_cluster.owner(slot)
    target.call("CLUSTER", "SETSLOT", slot, "IMPORTING", redis_cluster.node_id(source))
    source.call("CLUSTER", "SETSLOT", slot, "MIGRATING", redis_cluster.node_id(target))
    try:
        verdict = await outcome(storage.decide_within(1.0, "historian", hits, usage=True))
        assert isinstance(verdict, Verdict) and verdict.allowed
    finally:
        redis_cluster.finish_moving(slot, target)
    assert (await storage.decide("historian", hits, usage=True)).decisions[0].remaining == 97
    day = await storage.usage("historian", "day", time.time(), time.time())
    assert day[-1][1] == 3


async def test_resharding_under_load_never_raises_anything_else(
    make: StorageFactory, redis_cluster: ClusterDeployment,
) -> None:
    """Slots moving back and forth under 2000 decisions: verdicts or StorageError, never more
    admitted than the limit, and exact again once the slot settles."""
    storage = make(max_connections=20)
    hit = Hit(Limit("300/hour", "sliding_window"))
    slot = ClusterDeployment.slot(redis_key("p:", "busy", "", "u"))  # the tag decides the slot

    def reshard() -> None:
        for _ in range(3):
            redis_cluster.move_slot(slot, redis_cluster.nodes[other_node(redis_cluster, slot)])

    mover = asyncio.create_task(asyncio.to_thread(reshard))
    results: list[Verdict | StorageError] = []
    while not mover.done() or len(results) < 2000:
        results += await asyncio.gather(*(outcome(storage.decide("busy", [hit]))
                                          for _ in range(100)))
    await mover
    verdicts = [r for r in results if isinstance(r, Verdict)]
    admitted = sum(v.allowed for v in verdicts)
    assert admitted <= 300
    assert len(verdicts) >= len(results) // 2
    after = await storage.peek("busy", [hit])
    assert after.decisions[0].remaining == 300 - admitted


async def test_a_node_killed_under_load_gives_storage_errors_then_recovers(
    make: StorageFactory, redis_cluster: ClusterDeployment,
) -> None:
    """A node killed while 60 identities are decided at once, then restarted: verdicts or
    StorageError meanwhile, nothing else; then every decision succeeds again."""
    storage = make(max_connections=20, timeout=0.5)
    hit = Hit(Limit("100000/hour"))
    node = redis_cluster.owner(ClusterDeployment.slot(redis_key("p:", "id0", "", "u")))
    results: list[Verdict | StorageError] = []

    async def one_round() -> list[Verdict | StorageError]:
        found = await asyncio.gather(*(outcome(storage.decide(f"id{i}", [hit]))
                                       for i in range(60)))
        results.extend(found)
        return found

    async def load(stop: asyncio.Event) -> None:
        while not stop.is_set():
            await one_round()

    await one_round()
    stop = asyncio.Event()
    background = asyncio.create_task(load(stop))
    try:
        await asyncio.sleep(0.2)
        node.kill()
        await asyncio.sleep(1)
        assert any(isinstance(result, StorageError) for result in results)
    finally:
        await asyncio.to_thread(node.start)
    await asyncio.to_thread(redis_cluster.wait_until_ok)
    deadline = time.monotonic() + 10
    while not all(isinstance(result, Verdict) for result in await one_round()):
        assert time.monotonic() < deadline, "no recovery after the node came back"
        await asyncio.sleep(0.1)
    stop.set()
    await background  # re-raises anything but StorageError met under load


async def test_unreachable_cluster_is_a_storage_error(make: StorageFactory) -> None:
    """No startup node answers: StorageError (redis-py raises a non-RedisError here)."""
    from tests.conftest import free_port

    async with storage_factory(f"redis+cluster://127.0.0.1:{free_port()}") as dead_factory:
        dead = dead_factory(timeout=0.2)
        with pytest.raises(StorageError):
            await dead.decide("x", [Hit(Limit("1/second"))])
        assert not await dead.ping()


def _first_slots(cluster: ClusterDeployment, node: RedisProcess, count: int) -> set[int]:
    """The ``count`` lowest slots ``node`` serves: those ``redis-cli --cluster reshard``
    moves first."""
    owned = sorted(slot for start, end, (_, port, *_rest), *_replicas
                   in node.call("CLUSTER", "SLOTS") if port == node.port
                   for slot in range(start, end + 1))
    return set(owned[:count])


def _reshard(cluster: ClusterDeployment, source: RedisProcess, target: RedisProcess,
             slots: int) -> None:
    """``redis-cli --cluster reshard``: ``slots`` slots from ``source`` to ``target``."""
    subprocess.run(
        [shutil.which("redis-cli") or "redis-cli", "--cluster", "reshard",
         f"127.0.0.1:{source.port}", "--cluster-from", cluster.node_id(source),
         "--cluster-to", cluster.node_id(target), "--cluster-slots", str(slots),
         "--cluster-yes"],
        check=True, capture_output=True, timeout=120)


async def test_a_live_reshard_under_traffic_retries_within_the_timeout(
    make: StorageFactory, redis_cluster: ClusterDeployment,
) -> None:
    """``redis-cli --cluster reshard`` moves 200 slots while identities are decided on two
    limits each (two keys), old ones and new ones, many in slots that move: a new
    identity in a slot mid-migration gets TRYAGAIN (its keys are on neither node), an
    old one ASK; both are retried within the storage timeout (every decision a verdict,
    none a StorageError), and afterwards every count is exact."""
    storage = make(max_connections=20, timeout=2.0)
    hits = [Hit(Limit("1000000/hour", "fixed_window")),
            Hit(Limit("1000000/hour", "sliding_window"))]
    source, target = redis_cluster.nodes[0], redis_cluster.nodes[1]
    moving = _first_slots(redis_cluster, source, 200)

    def slot_of(name: str) -> int:
        return ClusterDeployment.slot(redis_key(storage.prefix, name, "", hits[0].limit.uid))

    names = [f"id{i}" for i in range(200_000)]
    movers = [name for name in names if slot_of(name) in moving]
    old = movers[:20] + [name for name in names if slot_of(name) not in moving][:20]
    fresh = iter(movers[20:])  # new identities, in slots that move
    for name in old:
        await storage.decide(name, hits)
    admitted = dict.fromkeys(old, 1)
    failures: list[StorageError] = []
    mover = asyncio.create_task(asyncio.to_thread(_reshard, redis_cluster, source, target, 200))
    try:
        while not mover.done():
            batch = old + [next(fresh) for _ in range(10)]
            results = await asyncio.gather(*(outcome(storage.decide(name, hits))
                                              for name in batch))
            for name, result in zip(batch, results, strict=True):
                if isinstance(result, StorageError):
                    failures.append(result)
                else:
                    admitted[name] = admitted.get(name, 0) + result.allowed
    finally:
        await mover
    assert not failures, failures[:3]
    for name, count in admitted.items():
        after = await storage.peek(name, hits)
        assert [d.remaining for d in after.decisions] == [1_000_000 - count] * 2, name


def _split_slot(cluster: ClusterDeployment, keys: list[str], moved: int) -> RedisProcess:
    """Mark the one slot of ``keys`` migrating to another node and MIGRATE the first
    ``moved`` of them there (the rest stay on the source); return the target."""
    (slot,) = {ClusterDeployment.slot(key) for key in keys}
    source = cluster.owner(slot)
    target = cluster.nodes[other_node(cluster, slot)]
    target.call("CLUSTER", "SETSLOT", slot, "IMPORTING", cluster.node_id(source))
    source.call("CLUSTER", "SETSLOT", slot, "MIGRATING", cluster.node_id(target))
    for key in keys[:moved]:
        assert source.call("MIGRATE", "127.0.0.1", target.port, key, 0, 5000) == "OK"
    return target


@pytest.mark.parametrize(("moved", "reply"), [(1, "TRYAGAIN"), (2, "ASK")])
async def test_a_slot_held_in_migration_is_waited_for_within_the_timeout(
    make: StorageFactory, redis_cluster: ClusterDeployment, moved: int, reply: str,
) -> None:
    """A slot held mid-migration for a second, one of a decision's two keys moved
    (TRYAGAIN, longer than redis-py's own 0.4 s of retries) or both (ASK): the decision
    is answered once the slot has moved, within the 3 s storage timeout, and its
    counts take in the earlier hits."""
    storage = make(timeout=3.0)
    name = f"held-{reply}"
    # An hour's fixed window: a minute's could end within the test and start afresh.
    hits = [Hit(Limit("10/hour", "fixed_window")), Hit(Limit("10/minute", "sliding_log"))]
    for _ in range(2):
        await storage.decide(name, hits)
    keys = [redis_key(storage.prefix, name, "", hit.limit.uid) for hit in hits]
    slot = ClusterDeployment.slot(keys[0])
    target = _split_slot(redis_cluster, keys, moved)
    try:
        decision = asyncio.create_task(outcome(storage.decide(name, hits)))
        await asyncio.sleep(1.0)
        # ASK is followed at once; TRYAGAIN is waited out until the slot has moved.
        assert decision.done() == (reply == "ASK"), decision.done() and decision.result()
    finally:
        await asyncio.to_thread(redis_cluster.finish_moving, slot, target)
    verdict = await decision
    assert isinstance(verdict, Verdict), verdict
    assert [d.remaining for d in verdict.decisions] == [7, 7]
    assert redis_cluster.owner(slot) is target
    after = await storage.peek(name, hits)
    assert [d.remaining for d in after.decisions] == [7, 7]

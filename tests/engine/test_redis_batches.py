"""How the Redis storage bounds its pipelined batches, and what it packs on the wire."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import multiprocessing
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from multiprocessing.connection import Connection
from typing import Any

import httpx
import pytest
import redis.asyncio as aioredis
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from ratelimit_mw import ConfigError, Hit, Limit, RedisStorage, Storage, StorageError
from ratelimit_mw.decision import Lease, Verdict
from ratelimit_mw.failure import GuardedStorage
from ratelimit_mw.middleware import RateLimitMiddleware
from ratelimit_mw.storage import inflight
from ratelimit_mw.storage.lease_ids import new_lease_id
from ratelimit_mw.tiers import Tier
from tests.redis_servers import delayed

HIT = Hit(Limit("100/minute", "fixed_window"))


@asynccontextmanager
async def frozen_redis() -> AsyncIterator[tuple[str, asyncio.Event]]:
    """A server that reads every command and never answers; the event is set when a
    client closes its connection."""
    closed = asyncio.Event()
    writers: list[asyncio.StreamWriter] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writers.append(writer)
        with contextlib.suppress(OSError):
            while await reader.read(65536):
                pass
        closed.set()
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"redis://127.0.0.1:{port}/0", closed
    finally:
        server.close()
        for writer in writers:  # a client that closed just now: its end of the socket too
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()


async def test_a_batch_past_its_deadline_fails_every_waiter() -> None:
    """No answer within the caller's timeout: every decision of the batch fails at once."""
    async with frozen_redis() as (url, _):
        storage = RedisStorage.from_url(url)  # no socket timeout: only the deadline bounds it
        try:
            start = time.monotonic()
            results = await asyncio.gather(
                *(storage.decide_within(0.1, f"k{i}", [HIT]) for i in range(5)),
                return_exceptions=True)
            assert time.monotonic() - start < 0.5
            assert all(isinstance(r, StorageError) for r in results), results
        finally:
            await storage.close()


@pytest.mark.slow
async def test_a_batch_cut_off_closes_its_connection() -> None:
    """Its callers fail at their deadline, but the exchange goes on for a grace period (a
    slow connection set-up finishes); past it, the connection is closed rather than
    pooled with replies still to come."""
    async with frozen_redis() as (url, closed):
        storage = RedisStorage.from_url(url)
        try:
            start = time.monotonic()
            with pytest.raises(StorageError):
                await storage.decide_within(0.1, "k", [HIT])
            assert time.monotonic() - start < 0.5
            assert not closed.is_set()
            await asyncio.wait_for(closed.wait(), 3.0)  # grace: max(1 s, 10 x the wait)
            assert time.monotonic() - start > 1.0
        finally:
            await storage.close()


@pytest.mark.slow
async def test_a_slow_connection_set_up_does_not_starve_the_storage(
    redis_url: str, redis_prefix: str,
) -> None:
    """A 24 ms round trip with a 50 ms storage timeout: setting up a connection takes
    several round trips and overruns the first decisions' deadline, but it completes, and
    the decisions after it are answered in time on the warm connection."""
    async with delayed(redis_url, 0.012) as url:
        storage = RedisStorage.from_url(url, prefix=redis_prefix, timeout=0.05)
        guard = GuardedStorage(storage, timeout=0.05, recovery_interval=0.2)
        try:
            sources = []
            for _ in range(30):
                sources.append((await guard.decide("k", [HIT]))[1])
                await asyncio.sleep(0.05)
        finally:
            await storage.close()
    assert sources[-10:] == ["storage"] * 10, sources


@pytest.mark.slow
async def test_the_storage_timeout_bounds_every_batch() -> None:
    """``from_url(timeout=)`` bounds decisions asked without a timeout, and releases
    (given at least a second: a slot not given back stays taken for its whole lease)."""
    async with frozen_redis() as (url, _):
        # No socket timeouts on the client: only the storage's own deadlines bound it.
        storage = RedisStorage(aioredis.Redis.from_url(url), timeout=0.1, owns_client=True)
        try:
            # The release first: a decision's connection is cut off a second past its
            # deadline, which would fail a release written after it on the same
            # connection just short of the release's own second.
            start = time.monotonic()
            with pytest.raises(StorageError):
                await storage.release([Lease("k", "", "uid", "lease")])
            assert 1.0 <= time.monotonic() - start < 1.5
            start = time.monotonic()
            with pytest.raises(StorageError):
                await storage.decide("k", [HIT])
            assert time.monotonic() - start < 0.5
        finally:
            await storage.close()


async def test_the_guard_leaves_the_timeout_to_redis_storage(
    redis_url: str, redis_prefix: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Through the guard, a Redis decision starts no timer of its own; others still do."""
    timers: list[float | None] = []
    original = asyncio.timeout

    def counting(delay: float | None) -> asyncio.Timeout:
        timers.append(delay)
        return original(delay)

    storage = RedisStorage.from_url(redis_url, prefix=redis_prefix)
    try:
        guard = GuardedStorage(storage, timeout=0.5)
        monkeypatch.setattr(asyncio, "timeout", counting)
        verdict, source = await guard.decide("k", [HIT])
        assert source == "storage" and verdict is not None and verdict.allowed
        assert timers == []
        await GuardedStorage(_Answering(), timeout=0.5).decide("k", [HIT])
        assert timers == [0.5]
    finally:
        await storage.close()


async def test_a_subclass_overriding_decide_is_timed_by_the_guard(
    redis_url: str, redis_prefix: str,
) -> None:
    """A RedisStorage subclass whose decide has the plain Storage signature (no timeout
    keyword) still decides through the guard, which times it itself."""
    calls = []

    class Traced(RedisStorage):
        async def decide(self, key: str, hits: Sequence[Hit], *,
                         usage: bool = False) -> Verdict:
            calls.append(key)
            return await super().decide(key, hits, usage=usage)

    storage = Traced(aioredis.Redis.from_url(redis_url), prefix=redis_prefix, owns_client=True)
    try:
        verdict, source = await GuardedStorage(storage, timeout=0.5).decide("k", [HIT])
        assert source == "storage" and verdict is not None and verdict.allowed
        assert calls == ["k"]
    finally:
        await storage.close()


async def test_the_guard_bound_holds_on_a_frozen_redis() -> None:
    """A frozen Redis behind the guard costs about the guard's timeout, then the policy
    answers."""
    async with frozen_redis() as (url, _):
        storage = RedisStorage.from_url(url)
        try:
            guard = GuardedStorage(storage, timeout=0.1)
            start = time.monotonic()
            verdict, source = await guard.decide("k", [HIT])
            assert time.monotonic() - start < 0.5
            assert (verdict, source) == (None, "unavailable")
        finally:
            await storage.close()


@pytest.mark.parametrize("flush", ["FUNCTION", "SCRIPT"])
async def test_a_lone_decision_reloads_the_script(
    own_redis_url: str, redis_prefix: str, flush: str,
) -> None:
    """A missing function on a batch of one (a restarted Redis) loads the library and
    decides."""
    storage = RedisStorage.from_url(own_redis_url, prefix=redis_prefix)
    raw = aioredis.Redis.from_url(own_redis_url)
    try:
        await storage.decide("k", [HIT])
        await raw.execute_command(flush, "FLUSH")
        verdict = await storage.decide("k", [HIT])
        assert verdict.decisions[0].remaining == 98
    finally:
        await raw.aclose()
        await storage.close()


def test_pipelining_needs_a_plain_redis_client() -> None:
    """Batches are packed for ``redis.asyncio.Redis``; another client can't ask for them."""
    with pytest.raises(ConfigError, match=r"pipeline=True needs a redis\.asyncio\.Redis"):
        RedisStorage(object(), pipeline=True)


def test_lease_ids_are_unique() -> None:
    """Lease ids share a per-process prefix and never repeat."""
    ids = [new_lease_id() for _ in range(1000)]
    assert len(set(ids)) == 1000
    assert len({lease_id[:16] for lease_id in ids}) == 1


def test_a_forked_worker_draws_its_own_lease_ids() -> None:
    """A worker forked from a process that already made ids (``--preload``) repeats none."""
    parent = new_lease_id()
    receiver, sender = multiprocessing.get_context("fork").Pipe(duplex=False)
    child = multiprocessing.get_context("fork").Process(target=_send_lease_id, args=(sender,))
    child.start()
    try:
        assert receiver.poll(10)
        theirs = receiver.recv()
    finally:
        child.join(10)
    assert theirs[:16] != parent[:16]


def _send_lease_id(sender: Connection) -> None:
    sender.send(new_lease_id())


class _Answering(Storage):
    """A storage that admits everything at once."""

    async def decide(self, key: str, hits: Sequence[Hit], *, usage: bool = False) -> Verdict:
        return Verdict(True, ())

    async def release(self, leases: Sequence[Lease]) -> None:
        return None

    async def usage(self, key: str, granularity: Any, start: float, end: float,
                    ) -> list[tuple[int, int]]:
        return []

    async def reset(self, key: str) -> None:
        return None


@pytest.mark.slow
async def test_a_decision_its_caller_gave_up_on_is_not_sent(
    redis_url: str, redis_prefix: str,
) -> None:
    """A decision still waiting for its connection to be set up when its caller's
    deadline passes is dropped: the failure policy answered that request, so Redis
    neither counts it nor holds a concurrency slot for it."""
    async with delayed(redis_url, 0.15) as url:  # a 300 ms round trip: a slow set-up
        # No socket timeouts: only the callers' deadlines bound the set-up.
        storage = RedisStorage(aioredis.Redis.from_url(url), prefix=redis_prefix,
                               owns_client=True)
        try:
            slot = Hit(Limit.concurrency(1, lease=30))
            with pytest.raises(StorageError):
                await storage.decide_within(0.05, "user", [slot])
            verdict = await storage.decide_within(2, "user", [slot])
            assert verdict.allowed
            assert verdict.decisions[0].remaining == 0  # only this request holds the slot
        finally:
            await storage.close()


async def test_a_slot_granted_after_its_caller_gave_up_goes_back(
    redis_url: str, redis_prefix: str,
) -> None:
    """A decision sent in time whose reply comes after its caller's deadline: if it took
    a concurrency slot, the slot is given back at once, not held for the whole lease."""
    async with delayed(redis_url, 0.02) as url:  # 40 ms round trip
        storage = RedisStorage.from_url(url, prefix=redis_prefix)
        try:
            slot = Hit(Limit.concurrency(1, lease=30))
            await storage.peek("user", [slot])  # a warm connection: the next one is sent
            with pytest.raises(StorageError):
                await storage.decide_within(0.02, "user", [slot])
            await asyncio.sleep(0.3)  # the late reply, then the ZREM, have gone through
            verdict = await storage.decide_within(1, "user", [slot])
            assert verdict.allowed, verdict
        finally:
            await storage.close()


def hello_reply(protocol: int) -> bytes:
    """What Redis 7 answers to ``HELLO <protocol>``: a map in RESP3, a flat list in
    RESP2 (redis-py 8 sends ``HELLO 3`` on every new connection and reads the map)."""
    facts = [(b"server", b"redis"), (b"version", b"7.0.15"), (b"proto", protocol),
             (b"id", 7), (b"mode", b"standalone"), (b"role", b"master"), (b"modules", [])]

    def encode(value: bytes | int | list[object]) -> bytes:
        if isinstance(value, int):
            return b":%d\r\n" % value
        if isinstance(value, list):
            return b"*0\r\n"
        return b"$%d\r\n%s\r\n" % (len(value), value)

    body = b"".join(encode(name) + encode(value) for name, value in facts)
    head = b"%%%d\r\n" % len(facts) if protocol == 3 else b"*%d\r\n" % (2 * len(facts))
    return head + body


@asynccontextmanager
async def scripted_redis(
    answer: bytes, **answers: bytes,
) -> AsyncIterator[tuple[str, asyncio.Event]]:
    """A server that answers the connection set-up as Redis 7 does (``HELLO`` with its
    map of server facts, ``CLIENT ...`` and ``SELECT`` with ``+OK``), a command named in
    ``answers`` (``SCRIPT=b"..."``) with its answer, and every other command with
    ``answer``; the event is set when a client hangs up."""
    import hiredis

    closed = asyncio.Event()
    writers: list[asyncio.StreamWriter] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writers.append(writer)
        commands = hiredis.Reader()
        with contextlib.suppress(OSError):
            while data := await reader.read(65536):
                commands.feed(data)
                while (command := commands.gets()) is not False:
                    name = command[0].upper()
                    if name == b"HELLO":
                        writer.write(hello_reply(int(command[1]) if len(command) > 1 else 2))
                    elif name in (b"CLIENT", b"SELECT"):
                        writer.write(b"+OK\r\n")
                    else:
                        writer.write(answers.get(name.decode(), answer))
        closed.set()
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    try:
        yield f"redis://127.0.0.1:{server.sockets[0].getsockname()[1]}/0", closed
    finally:
        server.close()
        for writer in writers:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()


@pytest.mark.parametrize("answer", [b"?not RESP\r\n", b":1\r\n", b"*1\r\n$1\r\nx\r\n"],
                         ids=["not RESP", "an integer", "a list of strings"])
async def test_a_reply_that_is_not_a_decision_fails_it(answer: bytes) -> None:
    """Bytes that are not RESP, or a reply of the wrong shape: a StorageError (the
    failure policy answers), never another exception."""
    async with scripted_redis(answer) as (url, _):
        storage = RedisStorage.from_url(url, timeout=1.0)
        try:
            with pytest.raises(StorageError):
                await storage.decide("k", [HIT])
        finally:
            await storage.close()


async def test_bytes_that_are_not_resp_drop_the_connection() -> None:
    """After bytes that are not RESP nothing can be matched to its command: the
    connection is closed (the next decision makes a new one)."""
    async with scripted_redis(b"?not RESP\r\n") as (url, closed):
        storage = RedisStorage.from_url(url, timeout=1.0)
        try:
            with pytest.raises(StorageError):
                await storage.decide("k", [HIT])
            await asyncio.wait_for(closed.wait(), 1.0)
        finally:
            await storage.close()


DECIDED = b"*6\r\n:1\r\n:1000\r\n:1\r\n:99\r\n:60000000\r\n:-1\r\n"
"""A decision's reply: admitted, 99 left."""


async def test_push_messages_are_not_taken_for_replies() -> None:
    """RESP3 push messages (a server's maintenance notices) between replies answer no
    command: each decision still gets its own reply."""
    push = b">3\r\n$6\r\nMOVING\r\n:1\r\n:15\r\n"
    async with scripted_redis(push + DECIDED) as (url, _):
        storage = RedisStorage.from_url(url, timeout=1.0)
        try:
            verdicts = await asyncio.gather(*(storage.decide("k", [HIT]) for _ in range(3)))
            assert [v.decisions[0].remaining for v in verdicts] == [99, 99, 99]
        finally:
            await storage.close()


async def test_a_reply_to_nothing_drops_the_connection() -> None:
    """One reply too many: the decision gets the first, and the connection is closed,
    since every reply after it would go to the wrong command."""
    decided = DECIDED
    async with scripted_redis(decided + b":7\r\n") as (url, closed):
        storage = RedisStorage.from_url(url, timeout=1.0)
        try:
            verdict = await storage.decide("k", [HIT])
            assert verdict.allowed and verdict.decisions[0].remaining == 99
            await asyncio.wait_for(closed.wait(), 1.0)
        finally:
            await storage.close()


async def test_an_error_reply_fails_only_its_own_command(
    redis_url: str, redis_prefix: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A command that Redis refuses fails alone; its batch-mates and the connection
    carry on."""
    storage = RedisStorage.from_url(redis_url, prefix=redis_prefix, timeout=1.0)
    try:
        await storage.decide("warm", [HIT])
        bad = storage._queue(inflight.DECIDE, b"*1\r\n$7\r\nNOTACMD\r\n", 1.0)
        good = storage.decide("k", [HIT])
        results = await asyncio.gather(bad, good, return_exceptions=True)
        assert "unknown command" in str(results[0]), results
        assert isinstance(results[1], Verdict) and results[1].allowed
        assert (await storage.decide("k", [HIT])).decisions[0].remaining == 98
    finally:
        await storage.close()


async def test_a_killed_connection_is_made_again(redis_url: str, redis_prefix: str) -> None:
    """Redis closing the decisions' connection (a restart, CLIENT KILL): the next
    decision connects again."""
    name = f"killed-{redis_prefix.strip(':')}"
    storage = RedisStorage.from_url(redis_url, prefix=redis_prefix, timeout=1.0,
                                    client_name=name)
    raw = aioredis.Redis.from_url(redis_url)
    try:
        await storage.decide("k", [HIT])
        killed = [client["id"] for client in await raw.client_list()
                  if client.get("name") == name]
        assert killed
        for client_id in killed:
            await raw.client_kill_filter(_id=client_id)
        await asyncio.sleep(0.1)  # the close reaches the storage
        verdict = await storage.decide("k", [HIT])
        assert verdict.decisions[0].remaining == 98
    finally:
        await raw.aclose()
        await storage.close()


# Run in a process of its own, so that the warning, emitted whenever the connection is
# collected, is seen here rather than in whatever test runs then.
_LOST_AS_THE_LOOP_ENDS = """
import asyncio, gc, sys, time
import redis
from ratelimit_mw import Hit, Limit, RedisStorage

url, prefix, name = sys.argv[1:]
storage = RedisStorage.from_url(url, prefix=prefix, timeout=1.0, client_name=name)

async def main() -> None:
    print((await storage.decide("k", [Hit(Limit("100/minute", "fixed_window"))])).allowed)
    admin = redis.Redis.from_url(url)
    for client in admin.client_list():
        if client.get("name") == name:
            admin.client_kill_filter(_id=client["id"])
    admin.close()
    time.sleep(0.1)  # blocking: the close is seen on the loop's next turn, its last
    await asyncio.sleep(0)

asyncio.run(main())
asyncio.run(storage.close())
gc.collect()
"""


@pytest.mark.slow
def test_a_connection_lost_as_its_loop_ends_is_not_left_unclosed(
    redis_url: str, redis_prefix: str,
) -> None:
    """The loop notices the loss in its last turn: redis-py's connection object lets go
    of the socket then, not in a task the ending loop would never run; else, collected
    later, it warns of an unclosed connection (an error under the suite's filters)."""
    name = f"lost-{redis_prefix.strip(':')}"
    run = subprocess.run(
        [sys.executable, "-W", "error::ResourceWarning", "-c", _LOST_AS_THE_LOOP_ENDS,
         redis_url, redis_prefix, name],
        capture_output=True, text=True, timeout=60, check=False)
    assert (run.returncode, run.stdout.strip()) == (0, "True"), run.stderr
    assert "ResourceWarning" not in run.stderr and "unclosed" not in run.stderr, run.stderr


@pytest.mark.slow
async def test_a_shorter_deadline_in_a_later_batch_still_holds() -> None:
    """One timer watches every batch: a later batch whose caller asked for less time
    than the batches before it still fails at its own deadline."""
    async with frozen_redis() as (url, _):
        storage = RedisStorage(aioredis.Redis.from_url(url), timeout=2.0, owns_client=True)
        try:
            first = asyncio.ensure_future(storage.decide("a", [HIT]))  # 2 s
            await asyncio.sleep(0.01)  # its batch is flushed
            start = time.monotonic()
            with pytest.raises(StorageError):
                await storage.decide_within(0.1, "b", [HIT])
            assert time.monotonic() - start < 0.5
            assert not first.done()
            with pytest.raises(StorageError):
                await first
        finally:
            await storage.close()


@pytest.mark.parametrize(("usage", "limited"), [(False, True), (True, True), (True, False)])
def test_a_packed_decision_is_the_command_redis_py_would_send(
    usage: bool, limited: bool,
) -> None:
    """The hand-packed FCALL is byte for byte what redis-py packs for the same
    arguments, for a new identity and for one whose keys were packed before (the
    usage buckets' prefix is a key only when there is no counter to route by)."""
    from redis.connection import Connection as SyncConnection  # never connected: packs

    from ratelimit_mw.storage import wire
    from ratelimit_mw.storage.keys import counter_suffix

    hits = (Hit(Limit("10/minute", "token_bucket", burst=20)),
            Hit(Limit("1000/day", "fixed_window"), 3, "route:/x"),
            Hit(Limit.concurrency(2))) if limited else ()
    packed = wire.pack_hits("ratelimit_mw_decide_f", hits, usage)
    encoder = SyncConnection()
    for tag, lease in [(b"rl:{ip:10.0.0.1}:", b"lease-1"), (b"rl:{ip:10.0.0.1}:", b"lease-2"),
                       (b"rl:{key:\xc3\xa9}:", b"")]:
        keys = [tag + counter_suffix(hit.scope, hit.limit.uid).encode() for hit in hits]
        if usage and not hits:
            keys.append(tag + b"u:")
        args = [f"{hit.limit.algorithm} {hit.limit.amount} {hit.limit.period_us} "
                f"{hit.limit.capacity} {hit.cost}".encode() for hit in hits]
        spec = b"168,90" if usage else b""
        expected = b"".join(encoder.pack_command(
            "FCALL", "ratelimit_mw_decide_f", len(keys), *keys, b"", lease, spec, *args))
        assert packed.command(tag, b"", lease, spec) == expected


async def test_a_list_of_hits_changed_between_decisions_is_packed_again(
    redis_url: str, redis_prefix: str,
) -> None:
    """Only a plan's merged hits (immutable) are known by identity: a list the caller
    changes is packed from what it holds now."""
    storage = RedisStorage.from_url(redis_url, prefix=redis_prefix, timeout=1.0)
    try:
        hits = [Hit(Limit("100/minute", "fixed_window"))]
        assert (await storage.decide("k", hits)).decisions[0].remaining == 99
        hits[0] = Hit(Limit("1/minute", "fixed_window"))
        assert (await storage.decide("k", hits)).allowed
        assert not (await storage.decide("k", hits)).allowed
    finally:
        await storage.close()


async def test_closing_while_a_connection_is_set_up_fails_its_callers() -> None:
    """close() just after a decision asked for a connection (even before the set-up
    began): the caller gets a StorageError, and the storage connects again when used."""
    async with frozen_redis() as (url, _):
        storage = RedisStorage(aioredis.Redis.from_url(url), timeout=5.0, owns_client=True)
        decision = asyncio.ensure_future(storage.decide("k", [HIT]))
        await asyncio.sleep(0)  # queued; the flush and the set-up come later
        await asyncio.sleep(0)
        await storage.close()
        with pytest.raises(StorageError, match="closed"):
            await asyncio.wait_for(decision, 1.0)
        with pytest.raises(StorageError, match="within the timeout"):
            await storage.decide_within(0.1, "k", [HIT])  # a new set-up, timed as usual
        await storage.close()


async def test_closing_fails_queued_callers_without_cancelling_them(
    redis_url: str, redis_prefix: str,
) -> None:
    """Callers whose commands were not sent yet when the storage closes get a
    StorageError (their failure policy answers), not a CancelledError."""
    storage = RedisStorage.from_url(redis_url, prefix=redis_prefix, timeout=1.0)
    await storage.decide("warm", [HIT])
    queued = [asyncio.ensure_future(storage.decide(f"k{i}", [HIT])) for i in range(3)]
    await asyncio.sleep(0)  # each has queued its command; the flush comes next tick
    await storage.close()
    results = await asyncio.gather(*queued, return_exceptions=True)
    assert all(isinstance(r, StorageError) for r in results), results


async def test_the_clients_socket_timeout_bounds_pipelined_decisions() -> None:
    """No storage timeout and no caller timeout: the client's own socket_timeout still
    bounds a decision (the pipe reads replies without redis-py)."""
    async with scripted_redis(b"") as (url, _):  # set up, then never answers
        client = aioredis.Redis.from_url(url, socket_timeout=0.2)
        storage = RedisStorage(client, owns_client=True)
        try:
            start = time.monotonic()
            with pytest.raises(StorageError):
                await storage.decide("k", [HIT])
            assert time.monotonic() - start < 1.0
        finally:
            await storage.close()


@pytest.mark.slow
async def test_a_give_back_without_a_deadline_does_not_spare_its_batch_a_cut_off(
    redis_url: str, redis_prefix: str,
) -> None:
    """A release with no deadline in the same batch as a timed decision: the batch
    is still cut off after the decision's grace period, and the release fails."""
    async with frozen_redis() as (url, closed):
        storage = RedisStorage(aioredis.Redis.from_url(url), owns_client=True)
        try:
            start = time.monotonic()
            results = await asyncio.gather(
                storage.decide_within(0.1, "k", [HIT]),
                storage.release([Lease("k", "", "uid", "lease")]),
                return_exceptions=True)
            assert all(isinstance(r, StorageError) for r in results), results
            await asyncio.wait_for(closed.wait(), 1.0)
            assert 1.0 < time.monotonic() - start < 2.5
        finally:
            await storage.close()


async def test_a_resp3_false_reply_keeps_the_replies_in_order() -> None:
    """RESP3's false (``#f``) is a reply like any other: it answers its own command,
    and the next command gets the next reply."""
    async with scripted_redis(b"#f\r\n") as (url, _):
        storage = RedisStorage.from_url(url, timeout=1.0)
        try:
            for _ in range(2):
                start = time.monotonic()
                with pytest.raises(StorageError, match="not a decision"):
                    await storage.decide("k", [HIT])
                assert time.monotonic() - start < 0.5
        finally:
            await storage.close()


async def test_a_script_that_cannot_be_loaded_says_why() -> None:
    """A missing function, then FUNCTION LOAD refused: the decision fails with the
    load's error, not with a bare "Function not found"."""
    async with scripted_redis(b"-ERR Function not found\r\n",
                              FUNCTION=b"-NOPERM this user has no permissions\r\n",
                              SCRIPT=b"$40\r\n" + b"f" * 40 + b"\r\n") as (url, _):
        storage = RedisStorage.from_url(url, timeout=1.0)
        try:
            with pytest.raises(StorageError, match="NOPERM"):
                await storage.decide("k", [HIT])
        finally:
            await storage.close()


@pytest.mark.parametrize("pipeline", [True, False])
async def test_a_server_without_functions_is_told_the_version_it_needs(pipeline: bool) -> None:
    """Before Redis 7.0 there is no FCALL: the error says which server would do."""
    async with scripted_redis(b"-ERR unknown command 'FCALL', with args beginning with: \r\n",
                              FUNCTION=b"-ERR unknown command 'FUNCTION', with args beginning "
                                       b"with: 'LOAD' \r\n") as (url, _):
        storage = RedisStorage(aioredis.Redis.from_url(url), owns_client=True, timeout=1.0,
                               pipeline=pipeline)
        try:
            with pytest.raises(StorageError, match=r"needs Redis 7\.0"):
                await storage.decide("k", [HIT])
        finally:
            await storage.close()


def test_a_storage_used_from_a_later_event_loop_still_answers(
    redis_url: str, redis_prefix: str,
) -> None:
    """One storage, two ``asyncio.run`` calls (as each test's own loop, or each
    ``TestClient`` session, would have it): the second loop's decisions are answered,
    not left waiting on the first loop's connection and timer; Python warns, at the
    next garbage collection, that the first loop's connection was never closed."""
    storage = RedisStorage.from_url(redis_url, prefix=redis_prefix, timeout=0.5)

    async def decide(close: bool) -> Verdict:
        try:
            return await asyncio.wait_for(storage.decide("k", [HIT]), 5)
        finally:
            if close:
                await storage.close()

    with pytest.warns(ResourceWarning, match="unclosed"):
        first = asyncio.run(decide(close=False))
        second = asyncio.run(decide(close=True))
        gc.collect()
    assert first.allowed and second.allowed
    assert second.decisions[0].remaining == first.decisions[0].remaining - 1


def test_two_sessions_on_their_own_loops_share_an_apps_redis_storage(
    redis_url: str, redis_prefix: str,
) -> None:
    """An app whose Redis storage the test made, driven from two event loops one after
    the other (as ``TestClient`` sessions or per-test loops do): both sessions'
    requests are decided by Redis, in one count."""
    storage = RedisStorage.from_url(redis_url, prefix=redis_prefix, timeout=1.0)
    app = Starlette(routes=[Route("/", lambda request: PlainTextResponse("ok"))])
    app.add_middleware(RateLimitMiddleware, tiers=[Tier("t", "100/minute")], storage=storage)

    async def session(close: bool) -> str:
        transport = httpx.ASGITransport(app=app)
        try:
            async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
                response = await asyncio.wait_for(client.get("/"), 10)
        finally:
            if close:
                await storage.close()
        return response.headers["x-ratelimit-remaining"]

    with pytest.warns(ResourceWarning, match="unclosed"):
        remaining = [asyncio.run(session(close=False)), asyncio.run(session(close=True))]
        gc.collect()
    assert remaining == ["99", "98"]


def test_a_storage_can_be_closed_from_a_later_event_loop(
    redis_url: str, redis_prefix: str,
) -> None:
    """Used in one loop and closed from the next (a synchronous fixture's teardown, a
    module-wide storage with a loop per test): ``close()`` works there."""
    storage = RedisStorage.from_url(redis_url, prefix=redis_prefix, timeout=0.5)
    with pytest.warns(ResourceWarning, match="unclosed"):
        assert asyncio.run(storage.decide("k", [HIT])).allowed
        asyncio.run(storage.close())
        gc.collect()


async def test_a_give_back_redis_never_answers_is_reported_once_per_slot() -> None:
    """On a Redis that reads and never answers, each slot given back at once is reported
    to ``on_failure`` once, with its own lease, when its deadline (at least 1 s) passes."""
    async with frozen_redis() as (url, _):
        storage = RedisStorage(aioredis.Redis.from_url(url), owns_client=True, timeout=0.1)
        failures: list[tuple[Sequence[Any], BaseException]] = []
        leases = (Lease("k", "", "a", "lease-a"), Lease("k", "", "b", "lease-b"))
        try:
            with pytest.raises(StorageError):  # sets up the connection, then times out
                await storage.decide_within(0.1, "k", [HIT])
            assert storage.release_now(leases, lambda items, exc: failures.append(
                (items, exc)))
            deadline = time.monotonic() + 3.0
            while len(failures) < 2 and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
        finally:
            await storage.close()
    assert sorted(items[0].uid for items, _ in failures) == ["a", "b"]
    assert all(len(items) == 1 and isinstance(exc, TimeoutError) for items, exc in failures)


async def test_a_failure_report_that_raises_does_not_stop_the_replies(
    redis_url: str, redis_prefix: str, caplog: pytest.LogCaptureFixture,
) -> None:
    """A settlement's ``on_failure`` that raises is logged; the pipe goes on handing
    replies to the commands after it."""
    storage = RedisStorage.from_url(redis_url, prefix=redis_prefix, timeout=1.0)

    def broken(items: Sequence[Any], exc: BaseException) -> None:
        raise RuntimeError("the report itself failed")

    try:
        await storage.decide("warm", [HIT])
        reported = inflight.Reported(broken, ["a command"])
        bad = storage._entry(inflight.RELEASE, b"*1\r\n$7\r\nNOTACMD\r\n", reported, 1.0, None,
                             asyncio.get_running_loop())
        storage._pipeline.write_now([bad], asyncio.get_running_loop())  # type: ignore[union-attr]
        verdict = await storage.decide("user", [HIT])
    finally:
        await storage.close()
    assert reported.done()
    assert verdict.allowed
    assert "reporting a failed str raised" in caplog.text

"""The one connection that pipelined decisions and slot give-backs share.

Commands queued in one event-loop tick are written together, without waiting for
the batch before them: Redis answers in order, so each reply goes to the oldest
command still waiting for one. Replies are parsed by hiredis as they arrive, in the
connection's own callback, so a batch costs one ``write`` and no task, lock or
pool checkout (redis-py's pool did all three for every batch).

The connection is made by the client's own connection class (so ``AUTH``,
``SELECT``, TLS and Sentinel's primary lookup happen as they would for any
command); it lives outside the client's pool, and is made again after it is lost.
When the pipe closes the socket, redis-py's connection object forgets it at once (not
in a task, which would never run if its event loop ended first): else, collected
later, it would warn of an unclosed connection in whatever runs then.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections import deque
from collections.abc import Callable
from typing import Any

from redis import exceptions as redis_errors
from redis.asyncio import Redis
from redis.asyncio.connection import AbstractConnection

from .inflight import Batch, Kind, Owner, Pipe, Queued, Reported, TakenSlots, fail, forget, live

__all__ = ["Kind", "Pipeline", "Queued", "Reported", "TakenSlots"]

_MOST_DOUBTFUL = 10_000  # slots kept to give back after a lost connection; more lapse


class Pipeline(Owner):
    """Queues packed commands and writes each tick's batch on the shared connection.

    ``abandon`` receives the slots of an admitted decision whose caller stopped waiting
    before its reply came; ``scripts`` are the ``FUNCTION LOAD`` and ``SCRIPT LOAD``
    commands sent on NOSCRIPT (or a missing function).
    After ``close()`` it may be used again: it connects anew (and must be closed again).
    """

    __slots__ = ("_abandon", "_client", "_connecting", "_cut", "_doubtful", "_held",
                 "_inflight", "_loop", "_pending", "_pipe", "_watch", "_watch_at")

    def __init__(self, client: Redis, scripts: tuple[bytes, ...],
                 abandon: Callable[[TakenSlots], None]) -> None:
        self._client = client
        super().__init__(scripts)
        self._abandon = abandon
        self._pending: list[Queued] = []  # queued in this tick, written at its end
        self._held: list[tuple[Batch, list[Queued]]] = []  # flushed while connecting
        self._pipe: Pipe | None = None
        self._connecting: asyncio.Task[None] | None = None
        self._cut = False  # the set-up is being cut off (not closed)
        # Batches with a deadline, oldest first, until they are done; one timer (not one
        # per batch: arming one costs more than the rest of a batch) looks at them when
        # the earliest deadline falls due.
        self._inflight: deque[Batch] = deque()
        self._watch: asyncio.TimerHandle | None = None
        self._watch_at = math.inf
        self._loop: asyncio.AbstractEventLoop | None = None  # the loop all this belongs to
        # The slots of decisions written on a connection lost before their reply: Redis
        # may still run them (a frozen Redis reads what was sent once it resumes), and
        # nobody would give those slots back. Given back once Redis answers again.
        self._doubtful: list[TakenSlots] = []

    @property
    def connected(self) -> bool:
        """True while the connection is up (a flush is written at once)."""
        pipe = self._pipe
        return pipe is not None and not pipe.transport.is_closing()

    def put(self, entry: Queued, loop: asyncio.AbstractEventLoop) -> None:
        """Queue ``entry`` for this tick's flush on ``loop``, the running loop (the caller
        has it at hand: asking again costs a system call, to check the process id)."""
        if loop is not self._loop:
            self._move_to(loop)
        if not self._pending:
            loop.call_soon(self.flush)
        self._pending.append(entry)

    def write_now(self, entries: list[Queued], loop: asyncio.AbstractEventLoop) -> None:
        """Write ``entries`` now, with whatever this tick has queued before them (on
        ``loop``, the running loop)."""
        if loop is not self._loop:
            self._move_to(loop)
        self._pending += entries
        self.flush(loop)

    def _move_to(self, loop: asyncio.AbstractEventLoop) -> None:
        """Start again on ``loop``, without what an earlier loop left behind.

        A connection, a timer, a task and a future belong to the loop that made them;
        used from a later loop (each test's own, each ``asyncio.run``, each
        ``TestClient`` session), they would leave its callers waiting for ever. The
        earlier loop's callers, if it still runs them, fail; its connection is dropped
        (closed if that loop can still close it; else Python warns that it was never
        closed, at the next garbage collection). One loop at a time, then.
        """
        old, self._loop = self._loop, loop
        if old is None:
            return
        moved = redis_errors.ConnectionError("the storage moved to another event loop")
        stranded = [*self._pending, *self._unanswered()]
        self._pending, self._held = [], []
        pipe, self._pipe = self._pipe, None
        connecting, self._connecting = self._connecting, None
        watch, self._watch, self._watch_at = self._watch, None, math.inf
        self._inflight.clear()
        self._doubtful = []
        self._cut = False
        if pipe is not None:
            pipe.closed = True
            pipe.waiting.clear()
        for entry in stranded:
            with contextlib.suppress(RuntimeError):  # the old loop is closed
                fail(entry[2], moved)
        with contextlib.suppress(RuntimeError):
            if watch is not None:
                watch.cancel()
            if connecting is not None:
                connecting.cancel()
            if pipe is not None:
                pipe.transport.abort()
                forget(pipe.connection)  # not reached if that loop is closed

    def _unanswered(self) -> list[Queued]:
        """Every command flushed and not answered yet: held while connecting, or written."""
        entries = [entry for _, held in self._held for entry in held]
        if self._pipe is not None:
            entries += (entry for _, entry, _ in self._pipe.waiting if entry is not None)
        return entries

    def flush(self, loop: asyncio.AbstractEventLoop | None = None) -> None:
        """Write what is queued (at the end of the tick, or now when called; ``loop``:
        the running loop, if the caller has it at hand)."""
        entries, self._pending = self._pending, []
        if not entries:  # close() failed them meanwhile
            return
        if loop is None:
            loop = asyncio.get_running_loop()
        batch = Batch(entries, loop.time())
        if batch.due != math.inf:
            inflight = self._inflight
            while inflight and inflight[0].done:
                inflight.popleft()
            inflight.append(batch)
            if batch.due < self._watch_at:
                self._arm(loop, batch.due)
        pipe = self._pipe
        if pipe is not None and not pipe.transport.is_closing():
            pipe.write(batch, live(entries))
            return
        self._held.append((batch, entries))
        if self._connecting is None:
            task = self._connecting = loop.create_task(self._connect())
            task.add_done_callback(self._connected)

    async def _connect(self) -> None:
        """Set up the connection with the client's connection class, then take it over;
        write what was flushed meanwhile (but decisions whose callers gave up: the
        failure policy answered those, so Redis must not count them)."""
        connection: AbstractConnection = (
            self._client.connection_pool.make_connection())  # type: ignore[no-untyped-call]
        try:
            await _connect_patiently(connection)
            writer = connection._writer  # redis-py's StreamWriter; its transport is ours now
            if writer is None:
                raise redis_errors.ConnectionError("the connection closed while set up")
            transport: Any = writer.transport
            pipe = Pipe(self, connection, transport)
            transport.set_protocol(pipe)
        except BaseException as exc:
            await connection.disconnect(nowait=True)
            if not isinstance(exc, Exception):
                raise exc  # cancelled: ``_connected`` fails what was held
            self._connecting = None
            self._fail_held(exc)
            return
        self._connecting = None
        old, self._pipe = self._pipe, pipe
        if old is not None:  # closing (READONLY): nothing more will be read from it
            self.lost(old, redis_errors.ConnectionError("connection to redis replaced"))
        held, self._held = self._held, []
        for batch, entries in held:
            pipe.write(batch, live(entries))

    def _connected(self, task: asyncio.Task[None]) -> None:
        """The set-up task ended; cancelled (cut off or closed, perhaps before it
        started), it fails what it was to write."""
        if task.get_loop() is not self._loop:
            return  # an earlier loop's set-up: ``_move_to`` dealt with what it held
        if self._connecting is task:
            self._connecting = None
        if task.cancelled():
            self._fail_held(
                TimeoutError("redis did not answer; connection set-up cut off") if self._cut
                else redis_errors.ConnectionError("the storage was closed"))
        self._cut = False

    def _fail_held(self, exc: BaseException) -> None:
        held, self._held = self._held, []
        for batch, entries in held:
            batch.done = True
            for entry in entries:
                fail(entry[2], exc)

    def answer(self, entry: Queued, reply: Any, failed: bool) -> None:
        """Hand ``reply`` to its caller (``failed``: it is the error Redis answered); if
        the caller gave up on an admitted decision, give back the slots it took for
        nobody."""
        if self._doubtful:
            self._give_back_doubtful()
        future = entry[2]
        if future.done():
            slots = entry[4]
            if slots is not None and isinstance(reply, list) and reply and reply[0] == 1:
                self._abandon(slots)
            return
        if failed:
            future.set_exception(reply)
        else:
            future.set_result(reply)

    def _give_back_doubtful(self) -> None:
        """Redis answers again, so it has run whatever a lost connection had sent it (read
        before anything written since): give back the slots those decisions may have
        taken (a ZREM of a slot never taken removes nothing)."""
        doubtful, self._doubtful = self._doubtful, []
        for slots in doubtful:
            self._abandon(slots)

    def lost(self, pipe: Pipe, exc: Exception) -> None:
        """The connection is gone: every command still waiting on it fails (a decision
        that took slots may still run: see ``_doubtful``)."""
        if self._pipe is pipe:
            self._pipe = None
        waiting, pipe.waiting = pipe.waiting, deque()
        doubtful = self._doubtful
        for batch, entry, _ in waiting:
            if batch is not None:
                batch.done = True
            if entry is not None:
                fail(entry[2], exc)
                if entry[4] is not None and len(doubtful) < _MOST_DOUBTFUL:
                    doubtful.append(entry[4])
        if not pipe.closed:
            pipe.closed = True
            pipe.transport.close()
            forget(pipe.connection)

    def _arm(self, loop: asyncio.AbstractEventLoop, when: float) -> None:
        if self._watch is not None:
            self._watch.cancel()
        self._watch = loop.call_at(when, self._look)
        self._watch_at = when

    def _look(self) -> None:
        """The timer: fail the callers past their deadline, cut off a connection whose
        batch is past its grace period, and set the timer for the next deadline."""
        self._watch, self._watch_at = None, math.inf
        loop = asyncio.get_running_loop()
        now = loop.time()
        due = math.inf
        cut: list[Batch] = []
        kept: deque[Batch] = deque()
        for batch in self._inflight:
            if batch.done:
                continue
            when = batch.check(now)
            if when == -math.inf:
                cut.append(batch)
            else:
                kept.append(batch)
                due = min(due, when)
        self._inflight = kept
        for batch in cut:
            self._cut_off(batch)
        if due != math.inf:
            self._arm(loop, due)

    def _cut_off(self, batch: Batch) -> None:
        """``batch`` is still unanswered far past its deadlines: close the connection it
        waits on (or stop setting one up) so that no later command waits behind it."""
        pipe = batch.pipe
        if pipe is not None:
            if not pipe.closed:
                pipe.transport.abort()
                self.lost(pipe, redis_errors.TimeoutError(
                    "redis did not answer; connection cut off"))
        elif not batch.done and self._connecting is not None:
            self._cut = True
            self._connecting.cancel()

    async def close(self) -> None:
        """Close the connection; callers still waiting for a decision fail with a
        ConnectionError. Commands that close holds (slots given back) are not dropped:
        they are written, and their answers awaited for up to a second."""
        closed = redis_errors.ConnectionError("the storage was closed")
        loop = asyncio.get_running_loop()
        if loop is not self._loop:
            self._move_to(loop)  # nothing an earlier loop left can be closed from here
        for entry in self._pending:
            if not entry[0].closes:
                fail(entry[2], closed)
        self._pending = [entry for entry in self._pending if entry[0].closes]
        self.flush()
        waits = [reply.waiter() if isinstance(reply, Reported) else reply
                 for kind, _, reply, _, _ in self._unanswered()
                 if kind.closes and not reply.done()]
        if waits:
            await asyncio.wait(waits, timeout=1.0)
        if self._connecting is not None:
            self._connecting.cancel()
            await asyncio.gather(self._connecting, return_exceptions=True)
        self._fail_held(closed)
        if self._pipe is not None:
            pipe = self._pipe
            pipe.transport.close()
            self.lost(pipe, closed)
            # Else a TLS connection could still be closing when its loop ends, and its
            # socket would be left open.
            await asyncio.wait([pipe.gone], timeout=1.0)
        # Closed on purpose: no give-back is left to start a connection of its own later,
        # perhaps once this loop has ended.
        self._doubtful = []
        if self._watch is not None:
            self._watch.cancel()
            self._watch, self._watch_at = None, math.inf
        self._inflight.clear()



async def _connect_patiently(connection: AbstractConnection) -> None:
    """Connect ``connection``, its handshake's replies (AUTH, HELLO, SELECT) bounded by
    the connect timeout: they are part of connecting, not a command that is slow."""
    read_timeout = connection.socket_timeout
    connect_timeout = connection.socket_connect_timeout
    if read_timeout is not None and connect_timeout is not None:
        connection.socket_timeout = max(read_timeout, connect_timeout)
    try:
        await connection.connect()  # type: ignore[no-untyped-call]
    finally:
        connection.socket_timeout = read_timeout


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
from typing import Any, Literal

import hiredis
from redis import exceptions as redis_errors
from redis.asyncio import Redis
from redis.asyncio.connection import AbstractConnection

__all__ = ["Pipeline", "Queued", "Slots"]

Kind = Literal["decide", "release"]
Slots = tuple[str, tuple[tuple[str, str], ...], str]
"""The concurrency slots a decision may take: its identity, ``(scope, uid)`` of each
slot, and the lease id."""
Queued = tuple[Kind, bytes, "asyncio.Future[Any]", float, Slots | None]
"""A packed command waiting for the next flush, the future of its reply, when its
caller stops waiting (loop time; inf: never), and the slots a decision may take."""


class _Batch:
    """The commands of one flush, from the flush until their last reply (or failure).

    Its callers fail at their deadlines (``check``, called by the pipeline's one
    timer); past the last deadline it allows a grace period (ten times the wait, at
    least a second) for the replies, then the connection is cut off rather than waited
    on any longer.
    """

    __slots__ = ("done", "due", "entries", "grace", "left", "pipe")

    def __init__(self, entries: list[Queued], now: float) -> None:
        self.entries = entries
        self.left = 0  # replies still to come
        self.done = False
        self.pipe: _Pipe | None = None  # the connection it was written on
        first = last = math.inf
        for entry in entries:
            deadline = entry[3]
            if deadline < first:
                first = deadline
            if deadline != math.inf and (last == math.inf or deadline > last):
                last = deadline
        self.due = first
        """When ``check`` should next run (inf: never)."""
        # An entry without a deadline does not spare the others' connection a cut-off.
        self.grace = math.inf if last == math.inf else last + max(1.0, 10 * (last - now))

    def check(self, now: float) -> float:
        """Fail the callers whose deadline has passed; the time to look again (-inf: the
        grace period is over, cut the connection off)."""
        if now >= self.grace:
            return -math.inf
        due = math.inf
        for _, _, future, deadline, _ in self.entries:
            if future.done():
                continue
            if deadline <= now:
                future.set_exception(TimeoutError("redis did not answer within the timeout"))
            elif deadline < due:
                due = deadline
        self.due = due if due != math.inf else self.grace
        return self.due

    def answered(self) -> None:
        """One reply in; with the last, the batch is done."""
        self.left -= 1
        if self.left <= 0:
            self.done = True


_MOST_DOUBTFUL = 10_000  # slots kept to give back after a lost connection; more lapse
_NO_REPLY = object()  # what the reader gives while a reply is incomplete (RESP3 has false)


class _Pipe:
    """The connection's protocol (an ``asyncio.Protocol`` by its methods) once it is set
    up: replies go to the commands written on it, oldest first."""

    __slots__ = ("_owner", "_reader", "closed", "connection", "gone", "load_error", "loading",
                 "transport", "waiting")

    def __init__(self, owner: Pipeline, connection: AbstractConnection,
                 transport: asyncio.WriteTransport) -> None:
        self._owner = owner
        self.connection = connection
        self.transport = transport
        self._reader = hiredis.Reader(replyError=redis_errors.ResponseError,
                                      notEnoughData=_NO_REPLY)
        self.closed = False
        # Done when the transport has let go of its socket (for TLS, after the
        # close_notify exchange, which outlives close()).
        self.gone: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.loading = False  # a SCRIPT LOAD written and not yet answered
        self.load_error: Exception | None = None  # why the last SCRIPT LOAD failed
        # (batch, entry, sent again after NOSCRIPT) of each command written and not yet
        # answered; batch and entry None for the SCRIPT LOAD written after a NOSCRIPT.
        self.waiting: deque[tuple[_Batch | None, Queued | None, bool]] = deque()

    def write(self, batch: _Batch, entries: list[Queued]) -> None:
        """Send ``entries`` (of ``batch``) in one write."""
        if not entries:
            batch.done = True
            return
        batch.pipe = self
        waiting = self.waiting
        for entry in entries:
            waiting.append((batch, entry, False))
        batch.left += len(entries)
        self.transport.write(b"".join([entry[1] for entry in entries]))

    def reload(self, script: bytes, batch: _Batch, entry: Queued) -> None:
        """After NOSCRIPT (a restarted or flushed Redis): load the script, once for all
        the commands written before the load, and send ``entry`` again (only once)."""
        if not self.loading:
            self.loading = True
            self.waiting.append((None, None, False))
            self.transport.write(script)
        self.waiting.append((batch, entry, True))
        self.transport.write(entry[1])

    def data_received(self, data: bytes) -> None:
        reader = self._reader
        reader.feed(data)
        waiting = self.waiting
        owner = self._owner
        try:
            while (reply := reader.gets()) is not _NO_REPLY:
                if isinstance(reply, _PUSH):
                    continue  # RESP3 out-of-band news (maintenance notices): no reply
                batch, entry, again = waiting.popleft()
                if batch is None or entry is None:  # the reply to SCRIPT LOAD
                    self.loading = False
                    self.load_error = reply if isinstance(reply, Exception) else None
                    continue
                if isinstance(reply, redis_errors.ResponseError):
                    reply = _error(reply)
                    if isinstance(reply, redis_errors.NoScriptError):
                        if not again and not entry[2].done():
                            self.reload(owner.script, batch, entry)
                            continue
                        if again and self.load_error is not None:
                            reply = self.load_error  # why the script is still missing
                    elif isinstance(reply, redis_errors.ReadOnlyError):
                        # A primary demoted by a failover: connect again (Sentinel then
                        # names the new primary).
                        self.transport.close()
                owner.answer(entry, reply)
                batch.answered()
        except (hiredis.ProtocolError, IndexError) as exc:
            # Bytes that are not RESP, or a reply to nothing: nothing after them can be
            # matched to its command.
            self.transport.abort()
            owner.lost(self, redis_errors.ConnectionError(f"bad reply from redis: {exc}"))

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.gone.done():
            self.gone.set_result(None)
        self._owner.lost(self, redis_errors.ConnectionError(
            f"connection to redis lost{f': {exc}' if exc else ''}"))

    def eof_received(self) -> bool:
        return False  # the transport closes itself; connection_lost follows

    def pause_writing(self) -> None:
        """Redis reads slower than we write: the transport buffers (deadlines bound it)."""

    def resume_writing(self) -> None:
        """The transport's buffer has drained."""


_PUSH = hiredis.PushNotification


def _error(reply: redis_errors.ResponseError) -> redis_errors.ResponseError:
    """The redis-py error class for an error reply (NOSCRIPT, READONLY …)."""
    text = str(reply)
    if text.startswith("NOSCRIPT"):
        return redis_errors.NoScriptError(text)
    if text.startswith("READONLY"):
        return redis_errors.ReadOnlyError(text)
    return reply


class Pipeline:
    """Queues packed commands and writes each tick's batch on the shared connection.

    ``abandon`` receives the slots of an admitted decision whose caller stopped waiting
    before its reply came; ``script`` is the ``SCRIPT LOAD`` command sent on NOSCRIPT.
    After ``close()`` it may be used again: it connects anew (and must be closed again).
    """

    __slots__ = ("_abandon", "_client", "_connecting", "_cut", "_doubtful", "_held",
                 "_inflight", "_loop", "_pending", "_pipe", "_watch", "_watch_at", "script")

    def __init__(self, client: Redis, script: bytes,
                 abandon: Callable[[Slots], None]) -> None:
        self._client = client
        self.script = script
        self._abandon = abandon
        self._pending: list[Queued] = []  # queued in this tick, written at its end
        self._held: list[tuple[_Batch, list[Queued]]] = []  # flushed while connecting
        self._pipe: _Pipe | None = None
        self._connecting: asyncio.Task[None] | None = None
        self._cut = False  # the set-up is being cut off (not closed)
        # Batches with a deadline, oldest first, until they are done; one timer (not one
        # per batch: arming one costs more than the rest of a batch) looks at them when
        # the earliest deadline falls due.
        self._inflight: deque[_Batch] = deque()
        self._watch: asyncio.TimerHandle | None = None
        self._watch_at = math.inf
        self._loop: asyncio.AbstractEventLoop | None = None  # the loop all this belongs to
        # The slots of decisions written on a connection lost before their reply: Redis
        # may still run them (a frozen Redis reads what was sent once it resumes), and
        # nobody would give those slots back. Given back once Redis answers again.
        self._doubtful: list[Slots] = []

    def put(self, entry: Queued, loop: asyncio.AbstractEventLoop) -> None:
        """Queue ``entry`` for this tick's flush on ``loop``, the running loop (the caller
        has it at hand: asking again costs a system call, to check the process id)."""
        if loop is not self._loop:
            self._move_to(loop)
        if not self._pending:
            loop.call_soon(self.flush)
        self._pending.append(entry)

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
                _fail(entry[2], moved)
        with contextlib.suppress(RuntimeError):
            if watch is not None:
                watch.cancel()
            if connecting is not None:
                connecting.cancel()
            if pipe is not None:
                pipe.transport.abort()
                _forget(pipe.connection)  # not reached if that loop is closed

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
        batch = _Batch(entries, loop.time())
        if batch.due != math.inf:
            inflight = self._inflight
            while inflight and inflight[0].done:
                inflight.popleft()
            inflight.append(batch)
            if batch.due < self._watch_at:
                self._arm(loop, batch.due)
        pipe = self._pipe
        if pipe is not None and not pipe.transport.is_closing():
            pipe.write(batch, _live(entries))
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
            await connection.connect()  # type: ignore[no-untyped-call]
            writer = connection._writer  # redis-py's StreamWriter; its transport is ours now
            if writer is None:
                raise redis_errors.ConnectionError("the connection closed while set up")
            transport: Any = writer.transport
            pipe = _Pipe(self, connection, transport)
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
            pipe.write(batch, _live(entries))

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
                _fail(entry[2], exc)

    def answer(self, entry: Queued, reply: Any) -> None:
        """Hand ``reply`` to its caller; if the caller gave up on an admitted decision,
        give back the slots it took for nobody."""
        if self._doubtful:
            self._give_back_doubtful()
        future = entry[2]
        if future.done():
            slots = entry[4]
            if slots is not None and isinstance(reply, list) and reply and reply[0] == 1:
                self._abandon(slots)
            return
        if isinstance(reply, Exception):
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

    def lost(self, pipe: _Pipe, exc: Exception) -> None:
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
                _fail(entry[2], exc)
                if entry[4] is not None and len(doubtful) < _MOST_DOUBTFUL:
                    doubtful.append(entry[4])
        if not pipe.closed:
            pipe.closed = True
            pipe.transport.close()
            _forget(pipe.connection)

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
        cut: list[_Batch] = []
        kept: deque[_Batch] = deque()
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

    def _cut_off(self, batch: _Batch) -> None:
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
        ConnectionError. Slots being given back are not dropped: their ZREMs are
        written, and their answers awaited for up to a second."""
        closed = redis_errors.ConnectionError("the storage was closed")
        loop = asyncio.get_running_loop()
        if loop is not self._loop:
            self._move_to(loop)  # nothing an earlier loop left can be closed from here
        for entry in self._pending:
            if entry[0] != "release":
                _fail(entry[2], closed)
        self._pending = [entry for entry in self._pending if entry[0] == "release"]
        self.flush()
        waits = [entry[2] for entry in self._unanswered()
                 if entry[0] == "release" and not entry[2].done()]
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


def _forget(connection: AbstractConnection) -> None:
    """Make redis-py's ``connection`` forget a socket the pipe has closed (or is closing:
    its stream writer, dropped, would close it otherwise), as its ``disconnect`` does."""
    connection._parser.on_disconnect()  # type: ignore[no-untyped-call]
    connection._reader = connection._writer = None


def _live(entries: list[Queued]) -> list[Queued]:
    """The entries to write: releases always, decisions whose callers still wait."""
    return [entry for entry in entries if entry[0] == "release" or not entry[2].done()]


def _fail(future: asyncio.Future[Any], exc: BaseException) -> None:
    if not future.done():
        future.set_exception(exc)

"""Commands on the pipelined connection until their replies come: what is queued, the
batch of one flush, and the connection's protocol, which parses the replies as they
arrive and hands each to the oldest command still waiting for one."""

from __future__ import annotations

import asyncio
import logging
import math
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any, Final, NamedTuple

import hiredis
from redis import exceptions as redis_errors
from redis.asyncio.connection import AbstractConnection

from ..hits import Slot
from .functions import function_missing, server_lacks_functions, too_old

logger = logging.getLogger("ratelimit_mw")

__all__ = ["DECIDE", "RELEASE", "SETTLE", "Batch", "Kind", "Owner", "Pipe", "Queued",
           "Reported", "TakenSlots", "fail", "forget", "live", "mark_seen"]


class Kind(NamedTuple):
    """What a pipelined command does. A command that ``closes`` what a request held
    (a lease given back, a charge settled) is written even when its caller no longer
    waits, and still sent when the storage closes; a decision nobody waits for is
    dropped instead."""

    name: str
    closes: bool = False


DECIDE = Kind("decide")
RELEASE = Kind("release", closes=True)
SETTLE = Kind("settle", closes=True)

TakenSlots = tuple[str, tuple[Slot, ...], str]
"""The concurrency slots a decision may take: its identity, ``(scope, uid)`` of each
slot, and the lease id."""


class Reported:
    """Where the reply of a command nobody awaits goes (a slot given back or a charge
    settled before the response ends): a success nowhere, a failure to
    ``on_failure(items, error)`` as it comes. It offers the few methods of a future that
    the pipeline calls, without a future's trip through the event loop."""

    __slots__ = ("_done", "_on_failure", "_waiter", "items")

    def __init__(self, on_failure: Callable[[Sequence[Any], BaseException], None],
                 items: Sequence[Any]) -> None:
        self._on_failure = on_failure
        self.items = items
        self._done = False
        self._waiter: asyncio.Future[None] | None = None

    def done(self) -> bool:
        return self._done

    def cancelled(self) -> bool:
        return False

    def set_result(self, result: object) -> None:
        self._end()

    def set_exception(self, exc: BaseException) -> None:
        if self._done:
            return
        self._end()
        try:
            self._on_failure(self.items, exc)
        except Exception:  # the pipe's callbacks must go on reading
            logger.exception("ratelimit_mw: reporting a failed %s raised",
                             type(self.items[0]).__name__ if self.items else "command")

    def waiter(self) -> asyncio.Future[None]:
        """A future of the running loop, done when this is (``close`` waits on it)."""
        if self._waiter is None:
            self._waiter = asyncio.get_running_loop().create_future()
            if self._done:
                self._waiter.set_result(None)
        return self._waiter

    def _end(self) -> None:
        self._done = True
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)


Queued = tuple[Kind, bytes, "asyncio.Future[Any] | Reported", float, TakenSlots | None]
"""A packed command waiting for the next flush, where its reply goes (a future its
caller awaits, or ``Reported``), when its caller stops waiting (loop time; inf: never),
and the slots a decision may take."""


class Batch:
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
        self.pipe: Pipe | None = None  # the connection it was written on
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


class Owner:
    """What a pipe hands its replies and its loss to: the pipeline. A base class, not a
    Protocol: compiled, a pipe calls its owner's methods directly."""

    __slots__ = ("scripts",)

    def __init__(self, scripts: tuple[bytes, ...]) -> None:
        self.scripts = scripts
        """The ``FUNCTION LOAD`` and ``SCRIPT LOAD`` commands sent again on NOSCRIPT (or
        a missing function)."""

    def answer(self, entry: Queued, reply: Any, failed: bool) -> None:
        raise NotImplementedError

    def lost(self, pipe: Pipe, exc: Exception) -> None:
        raise NotImplementedError


_NO_REPLY: Final = object()  # what the reader gives while a reply is incomplete (RESP3 has
# false); Final, as the two below: compiled, a C static rather than a look-up per reply
_PUSH: Final = hiredis.PushNotification
_RESPONSE_ERROR: Final = redis_errors.ResponseError


class Pipe:
    """The connection's protocol (an ``asyncio.Protocol`` by its methods) once it is set
    up: replies go to the commands written on it, oldest first."""

    __slots__ = ("_owner", "_reader", "closed", "connection", "gone", "load_error", "loading",
                 "transport", "waiting")

    def __init__(self, owner: Owner, connection: AbstractConnection,
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
        self.loading = 0  # SCRIPT LOADs written and not yet answered
        self.load_error: Exception | None = None  # why the last reload failed
        # (batch, entry, sent again after NOSCRIPT) of each command written and not yet
        # answered; batch and entry None for the SCRIPT LOAD written after a NOSCRIPT.
        self.waiting: deque[tuple[Batch | None, Queued | None, bool]] = deque()

    def write(self, batch: Batch, entries: list[Queued]) -> None:
        """Send ``entries`` (of ``batch``) in one write."""
        if not entries:
            batch.done = True
            return
        batch.pipe = self
        waiting = self.waiting
        for entry in entries:
            waiting.append((batch, entry, False))
        batch.left += len(entries)
        if len(entries) == 1:  # a lone decision, a slot given back at once
            self.transport.write(entries[0][1])
        else:
            self.transport.write(b"".join([entry[1] for entry in entries]))

    def reload(self, scripts: tuple[bytes, ...], batch: Batch, entry: Queued) -> None:
        """After NOSCRIPT (a restarted or flushed Redis): load the scripts, once for all
        the commands written before the load, and send ``entry`` again (only once)."""
        if not self.loading:
            self.loading = len(scripts)
            self.load_error = None
            for script in scripts:
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
                plain = type(reply) is list or type(reply) is int  # a decision, a ZREM
                if not plain and isinstance(reply, _PUSH):
                    continue  # RESP3 out-of-band news (maintenance notices): no reply
                batch, entry, again = waiting.popleft()
                if batch is None or entry is None:  # the reply to a SCRIPT LOAD
                    self.loading -= 1
                    if isinstance(reply, Exception):
                        self.load_error = reply
                    continue
                if not plain and isinstance(reply, _RESPONSE_ERROR):
                    reply = _error(reply)
                    if isinstance(reply, redis_errors.NoScriptError):
                        if not again and not entry[2].done():
                            self.reload(owner.scripts, batch, entry)
                            continue
                        if again and self.load_error is not None:
                            reply = self.load_error  # why the script is still missing
                    elif isinstance(reply, redis_errors.ReadOnlyError):
                        # A primary demoted by a failover: connect again (Sentinel then
                        # names the new primary).
                        self.transport.close()
                owner.answer(entry, reply, not plain and isinstance(reply, Exception))
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



def _error(reply: redis_errors.ResponseError) -> redis_errors.ResponseError:
    """The redis-py error class for an error reply (NOSCRIPT or a missing function,
    READONLY …)."""
    text = str(reply)
    if text.startswith("NOSCRIPT") or function_missing(reply):
        return redis_errors.NoScriptError(text)  # a flushed or restarted server
    if server_lacks_functions(reply):
        return too_old(reply)
    if text.startswith("READONLY"):
        return redis_errors.ReadOnlyError(text)
    return reply


def forget(connection: AbstractConnection) -> None:
    """Make redis-py's ``connection`` forget a socket the pipe has closed (or is closing:
    its stream writer, dropped, would close it otherwise), as its ``disconnect`` does."""
    connection._parser.on_disconnect()  # type: ignore[no-untyped-call]
    connection._reader = connection._writer = None



def live(entries: list[Queued]) -> list[Queued]:
    """The entries to write: those that close holds always, decisions whose callers
    still wait."""
    return [entry for entry in entries if entry[0].closes or not entry[2].done()]


def fail(future: asyncio.Future[Any] | Reported, exc: BaseException) -> None:
    if not future.done():
        future.set_exception(exc)


def mark_seen(future: asyncio.Future[Any]) -> None:
    """Mark a fire-and-forget command's error as seen (its slot frees with its lease)."""
    if not future.cancelled():
        future.exception()

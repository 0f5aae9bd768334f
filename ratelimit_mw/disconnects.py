"""Noticing that a client left while its request holds concurrency slots.

The slots go back at once, though the app runs on (a handler that never reads its
request would otherwise keep them until it returns).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from starlette.types import Message, Receive

__all__ = ["DisconnectWatch", "DisconnectWatches"]

WATCH_AFTER = 1.0
"""Seconds (at most) a request holding slots runs before a task watches for its client
leaving."""


class DisconnectWatches:
    """The requests holding slots now, and one timer for them all: every `WATCH_AFTER`
    seconds (while there are some), those still running get their watching task. One
    timer a second, not one per request."""

    __slots__ = ("_running", "_timer")

    def __init__(self) -> None:
        self._running: dict[int, DisconnectWatch] = {}
        self._timer: asyncio.TimerHandle | None = None

    def add(self, watch: DisconnectWatch) -> None:
        self._running[id(watch)] = watch
        if self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(WATCH_AFTER, self._due)

    def discard(self, watch: DisconnectWatch) -> None:
        self._running.pop(id(watch), None)

    def _due(self) -> None:
        self._timer = None
        running = list(self._running.values())
        self._running.clear()
        for watch in running:
            watch.start()


class DisconnectWatch:
    """``receive`` for a request holding concurrency slots: ``gone`` is called when the
    client disconnects, so the slots go back though the app runs on.

    The app's own ``receive`` calls tell; a request still running after (at most)
    `WATCH_AFTER` seconds (a handler that never reads would not tell) gets a task that
    reads for it, a message at a time, each handed over when the app asks. While the
    app waits on ``receive`` itself, the task starts only once that call returns: two
    readers at once could take a message from each other.
    """

    __slots__ = ("_due", "_gone", "_inbox", "_last", "_reading", "_receive", "_task",
                 "_watches")

    def __init__(self, receive: Receive, gone: Callable[[], None],
                 watches: DisconnectWatches) -> None:
        self._receive = receive
        self._gone = gone
        self._reading = False  # the app is in receive() itself
        self._due = False  # the task is due, once the app's call returns
        self._task: asyncio.Task[None] | None = None
        self._inbox: asyncio.Queue[Message | Exception] | None = None  # the task's, for the app
        self._last: Message | Exception | None = None  # the disconnect (or error) it ended on
        self._watches = watches
        watches.add(self)

    async def __call__(self) -> Message:
        inbox = self._inbox
        if inbox is not None:
            last = self._last if inbox.empty() and self._last is not None else await inbox.get()
            if isinstance(last, Exception):
                raise last
            return last
        self._reading = True
        try:  # not a finally: see RateLimitMiddleware._holding_slots
            message = await self._receive()
        except BaseException as exc:
            self._reading = False
            raise exc
        self._reading = False
        if message["type"] == "http.disconnect":
            self._due = False
            self._gone()
        elif self._due:
            self.start()
        return message

    def start(self) -> None:
        """Start the watching task (once the app's own receive call returns, if any)."""
        if self._reading:
            self._due = True
        elif self._task is None:
            self._due = False
            self._inbox = asyncio.Queue(1)
            self._task = asyncio.ensure_future(self._read(self._inbox))

    async def _read(self, inbox: asyncio.Queue[Message | Exception]) -> None:
        last: Message | Exception
        try:
            while True:
                message = await self._receive()
                if message["type"] == "http.disconnect":
                    last = message
                    self._gone()
                    break
                await inbox.put(message)
        except Exception as exc:  # the app gets it, as if it had called receive
            last = exc
        # Every later call gets it too; one waiting now is woken with it.
        self._last = last
        if inbox.empty():
            inbox.put_nowait(last)

    def stop(self) -> None:
        """The app call ended: no task any more."""
        self._watches.discard(self)
        if self._task is not None:
            self._task.cancel()


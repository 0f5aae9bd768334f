"""What a request holds after its decision, until it ends: taking, renewing and closing it.

A decision may leave something open until its request is over: the leases of
concurrency slots, which closing gives back, and charges reserved before the app ran,
which closing settles once the response has said what they cost (``SettlingHolding``).
``Holds`` (one per middleware) takes a request's holds when it is admitted, renews the
leases while it runs, and closes them when it ends: just before the last body chunk
goes out (``Holding``, the request's ``send``), or when the app call ends otherwise (a
client disconnect stops the response, the app raises). Closing never raises: a lease
not given back ends by itself, a settlement not made leaves the estimate charged.
A shaped request is held for its turn before any of this (``shaping.Turns``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Sequence
from typing import Any

from starlette.types import Message, Send

from .asgi import Header
from .decision import Adjustment, Hold, Lease
from .events import Source
from .hits import Hit
from .leases import LeaseRenewals
from .metrics import Metrics
from .outages import OutageLog
from .sending import with_headers
from .storage import Storage

__all__ = ["Holding", "Holds", "SettlingHolding"]


class Holds:
    """The holds of this worker's requests on ``storage`` (and on the ``fallback`` that
    decides while it is down), with one verb for ending them: ``close``."""

    __slots__ = ("_batch", "_fallback", "_metrics", "_released", "_renewals", "_settled",
                 "_storage", "_tasks")

    def __init__(self, storage: Storage, fallback: Storage | None, *, lease: float,
                 timeout: float, metrics: Metrics | None = None) -> None:
        self._storage = storage
        self._metrics = metrics
        self._fallback = fallback
        self._renewals = LeaseRenewals(lease, self.storage_of)
        # A close awaited on the storage waits at most this long (a second at least: a
        # slot not given back stays taken for its whole lease).
        self._batch = _ClosingBatch(max(1.0, timeout))
        self._tasks: set[asyncio.Task[None]] = set()
        # Holds not closed are logged once an outage (``outages``), counted in metrics.
        self._released = OutageLog("slot release", "slot_release_failed",
                                   "slots not given back free themselves when their lease ends")
        self._settled = OutageLog("settlement", "settlement_failed",
                                  "charges not settled keep their estimates")

    def storage_of(self, source: Source) -> Storage:
        """The storage whose holds a verdict from ``source`` has."""
        if source == "fallback" and self._fallback is not None:
            return self._fallback
        return self._storage

    def take(self, leases: tuple[Lease, ...], source: Source, tier: str) -> None:
        """``leases``, granted by the storage of ``source`` to a request of ``tier``, are
        held from now: renewed until ``drop``."""
        self._renewals.hold(leases, source)
        if self._metrics is not None:
            self._metrics.slots_in_flight(tier, len(leases))

    def drop(self, leases: tuple[Lease, ...], tier: str) -> None:
        """``leases`` are closed (or about to be): no more renewing."""
        self._renewals.drop(leases)
        if self._metrics is not None:
            self._metrics.slots_in_flight(tier, -len(leases))

    def close_now(self, leases: tuple[Lease, ...], source: Source) -> bool:
        """Close ``leases`` without awaiting, where their storage can (a lease's own
        no-await close, ``Storage.release_now``); False when ``close`` must be awaited."""
        try:
            return self.storage_of(source).release_now(leases, self._not_closed)
        except Exception as exc:
            self._not_closed(leases, exc)
            return True  # given up on: the lease ends it

    async def close(self, leases: tuple[Lease, ...], source: Source) -> None:
        """Close ``leases``; never raises.

        Without awaiting where the storage can; else in one ``Storage.close_holds`` call
        shared by the requests ending in the same event-loop iteration, bounded by a
        timeout. A cancelled request can't cut that call off: it goes on without the
        request.
        """
        if self.close_now(leases, source):
            return
        task = asyncio.current_task()
        cancelling = task is not None and task.cancelling()
        try:
            done = self._batch.submit(self.storage_of(source), leases)
            if cancelling:
                return
            await asyncio.shield(done)
        except Exception as exc:
            self._not_closed(leases, exc)
        else:
            self._released.succeeded()

    def close_soon(self, leases: tuple[Lease, ...], source: Source) -> None:
        """Close ``leases`` now if their storage can, else in a task of their own."""
        if not self.close_now(leases, source):
            task: asyncio.Task[None] = asyncio.ensure_future(self.close(leases, source))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    def settle_now(self, adjustments: list[Adjustment], source: Source) -> bool:
        """Settle ``adjustments`` without awaiting, where their storage can
        (``Storage.settle_now``); False when ``settle`` must be awaited."""
        try:
            return self.storage_of(source).settle_now(adjustments, self._not_closed)
        except Exception as exc:
            self._not_closed(adjustments, exc)
            return True  # given up on: the estimates stay charged

    async def settle(self, adjustments: list[Adjustment], source: Source) -> None:
        """Settle ``adjustments`` on the storage of ``source``; never raises (a failure
        leaves the estimates charged, counted and logged)."""
        if self.settle_now(adjustments, source):
            return
        try:
            async with asyncio.timeout(self._batch.timeout):
                await self.storage_of(source).close_holds(adjustments)
        except Exception as exc:
            self._not_closed(adjustments, exc)
        else:
            self._settled.succeeded()

    def settle_soon(self, adjustments: list[Adjustment], source: Source) -> None:
        """``settle``, in a task of its own where it must be awaited."""
        if not self.settle_now(adjustments, source):
            task: asyncio.Task[None] = asyncio.ensure_future(self.settle(adjustments, source))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    def _not_closed(self, holds: Sequence[Hold], exc: BaseException) -> None:
        """Log (and count) holds that could not be closed."""
        settlements = sum(1 for hold in holds if isinstance(hold, Adjustment))
        slots = len(holds) - settlements
        if slots:
            self._released.failed(exc, slots)
        if settlements:
            self._settled.failed(exc, settlements)
        if self._metrics is not None:
            if slots:
                self._metrics.slot_release_failed(slots)
            if settlements:
                self._metrics.settlement_failed(settlements)


class _ClosingBatch:
    """Closes the holds of the requests that end in one event-loop iteration together,
    in one ``close_holds`` call per storage bounded by a timeout (on Redis, the storage
    sends them in the pipeline of that iteration's decisions)."""

    __slots__ = ("_batches", "_tasks", "timeout")

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        # id(storage) -> (storage, the holds queued, the future they share)
        self._batches: dict[int, tuple[Storage, list[Hold], asyncio.Future[None]]] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    def submit(self, storage: Storage, holds: Sequence[Hold]) -> asyncio.Future[None]:
        """Queue ``holds``; the future resolves once they are closed (or failed to be)."""
        batch = self._batches.get(id(storage))
        if batch is None:
            loop = asyncio.get_running_loop()
            done: asyncio.Future[None] = loop.create_future()
            done.add_done_callback(_mark_seen)
            batch = self._batches[id(storage)] = (storage, [], done)
            # The task starts on the next iteration: requests ending meanwhile join it.
            task = loop.create_task(self._run(id(storage)))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        batch[1].extend(holds)
        return batch[2]

    async def _run(self, storage_id: int) -> None:
        storage, holds, done = self._batches.pop(storage_id)
        try:
            async with asyncio.timeout(self.timeout):
                await storage.close_holds(holds)
        except Exception as exc:
            done.set_exception(exc)
        else:
            done.set_result(None)


def _mark_seen(future: asyncio.Future[None]) -> None:
    """Mark a batch's error as seen (its waiters may all have been cancelled)."""
    if not future.cancelled():
        future.exception()


class Holding:
    """``send`` for a request that holds something (the ``leases`` it took on the storage
    of ``source``, as a caller of ``tier``): adds ``headers`` to the response start, and
    closes the holds just before the last body chunk (a HEAD response's start, whose
    body is never sent), so that a client that has seen the end of its response never
    finds its slot still taken, and a background task running after the response does
    not hold it.

    Where the storage closes holds without awaiting (memory, pipelined Redis) the
    message goes out at once; else after the storage has answered. ``close`` and
    ``close_soon`` close them when the request ends otherwise (the app raised, the
    client left); each of the three closes them once at most.
    """

    __slots__ = ("head", "headers", "holding", "holds", "leases", "send", "source", "tier")

    def __init__(self, send: Send, headers: list[Header], holds: Holds,
                 leases: tuple[Lease, ...], source: Source, tier: str, head: bool) -> None:
        self.send = send
        self.headers = headers
        self.holds = holds
        self.leases = leases
        self.source = source
        self.tier = tier
        self.head = head
        self.holding = bool(leases)

    def __call__(self, message: Message) -> Awaitable[None]:
        kind = message["type"]
        if kind == "http.response.start":
            if self.headers:
                message = with_headers(message, self.headers)
            if self.head and self.holding:
                return self._closed_then_sent(message)
        elif self.holding and kind == "http.response.body" and not message.get("more_body"):
            return self._closed_then_sent(message)
        return self.send(message)

    def _closed_then_sent(self, message: Message) -> Awaitable[None]:
        self.holding = False
        if self.holds.close_now(self.leases, self.source):
            return self.send(message)
        return self._close_and_send(message)

    async def _close_and_send(self, message: Message) -> None:
        await self.holds.close(self.leases, self.source)
        await self.send(message)

    async def close(self) -> None:
        """Close the holds if the response did not (never raises)."""
        if self.holding:
            self.holding = False
            await self.holds.close(self.leases, self.source)

    def close_soon(self) -> None:
        """The client left: close the holds now, or in a task of their own."""
        if self.holding:
            self.holding = False
            self.holds.close_soon(self.leases, self.source)


class SettlingHolding(Holding):
    """``Holding`` for a request whose charges the response settles (``settled``, the
    hits reserved at ``at`` for the caller ``key``): it reads the status and the
    headers as the response starts (taking out a cost header the client is not to
    see), and settles when the body ends, after the stream has had its say in the
    request's ``state``. A client that leaves does not stop the app, and the app's
    response settles when it comes; an app that raises settles as its 500 would; a
    request cancelled before its response keeps its estimate charged."""

    __slots__ = ("at", "costs", "key", "settled", "settling", "state", "status")

    def __init__(self, send: Send, headers: list[Header], holds: Holds,
                 leases: tuple[Lease, ...], source: Source, tier: str, head: bool,
                 key: str, at: float, settled: tuple[Hit, ...], state: Any) -> None:
        super().__init__(send, headers, holds, leases, source, tier, head)
        self.key = key
        self.at = at
        self.settled = settled
        self.state = state
        self.settling = True
        self.status = 0  # none seen yet
        self.costs: list[int | None] = []

    def __call__(self, message: Message) -> Awaitable[None]:
        kind = message["type"]
        if kind == "http.response.start" and not self.status:
            message = self._started(message)
            if self.head:
                return self._settled_then_sent(message)
        elif kind == "http.response.body" and not message.get("more_body"):
            return self._settled_then_sent(message)
        return super().__call__(message)

    def _settled_then_sent(self, message: Message) -> Awaitable[None]:
        """Settle before the response's end goes out, as leases close: a client that
        has seen it finds its charge settled. At once where the storage can."""
        adjustments = self._take_adjustments()
        if not adjustments or self.holds.settle_now(adjustments, self.source):
            return super().__call__(message)
        return self._settle_and_send(message, adjustments)

    async def _settle_and_send(self, message: Message, adjustments: list[Adjustment]) -> None:
        await self.holds.settle(adjustments, self.source)
        await Holding.__call__(self, message)

    def _started(self, message: Message) -> Message:
        """Note the status and the costs the headers say; drop the headers to hide."""
        self.status = int(message.get("status", 500))
        if not any(hit.limit.settlement is not None and hit.limit.settlement.reads_headers
                   for hit in self.settled):
            return message  # a count, a fixed cost or the state: no header to read
        raw = message.get("headers") or ()
        headers = {name.decode("latin-1").lower(): value.decode("latin-1")
                   for name, value in raw}
        hidden: set[bytes] = set()
        for hit in self.settled:
            reader = hit.limit.settlement.cost if hit.limit.settlement else None
            if reader is None or reader.state:
                self.costs.append(None)
                continue
            self.costs.append(reader.read(self.status, headers, None))
            if reader.remove:
                hidden.add(reader.header_bytes)
        if hidden:
            message = {**message, "headers": [
                (name, value) for name, value in raw if name.lower() not in hidden]}
        return message

    def adjustments(self) -> list[Adjustment]:
        """What the response settles: for each reserved hit, the real cost (0 when the
        response does not count) less the estimate, where they differ."""
        out = []
        status = self.status or 500
        for i, hit in enumerate(self.settled):
            settlement = hit.limit.settlement
            if settlement is None:
                continue
            actual = hit.cost
            if not settlement.count.counts(status):
                actual = 0
            elif settlement.cost is not None:
                read = (settlement.cost.read(status, {}, self.state) if settlement.cost.state
                        else self.costs[i] if i < len(self.costs) else None)
                if read is not None:
                    actual = read
            if actual != hit.cost:
                out.append(Adjustment(self.key, hit, actual - hit.cost, self.at))
        return out

    def _take_adjustments(self) -> list[Adjustment]:
        """The adjustments to make, once: none after the first call."""
        if not self.settling:
            return []
        self.settling = False
        return self.adjustments()

    async def close(self) -> None:
        """Close what the response did not (the app raised or ended without one): the
        leases, and the charges as its status says (500 when it sent none)."""
        await super().close()
        adjustments = self._take_adjustments()
        if adjustments:
            await self.holds.settle(adjustments, self.source)

    def keep_estimates(self) -> None:
        """The request was cancelled before its response: nothing says what it cost,
        so its estimates stay charged."""
        self.settling = False

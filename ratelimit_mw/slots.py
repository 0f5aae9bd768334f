"""Concurrency slots held by this worker's requests: renewed while held, given back after.

A slot is a lease: taken with the request's limits in one storage call, renewed every
third of a lease while the request runs (however long: a stream, a websocket), and
given back when it ends. A worker that dies renews nothing, and its slots end within
a lease. Giving back never raises: a slot that can't be given back ends with its
lease.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence

from .decision import Lease
from .errors import describe_error
from .events import Source
from .limits import Limit
from .metrics import Metrics
from .storage import Storage

__all__ = ["Slots"]

_log = logging.getLogger("ratelimit_mw")


class Slots:
    """The slots held on ``storage`` (and on the ``fallback`` that decides while it is
    down), with one verb for giving them back: ``release``."""

    __slots__ = ("_batch", "_fallback", "_metrics", "_renewals", "_storage", "_tasks",
                 "_tiers")

    def __init__(self, storage: Storage, fallback: Storage | None, *, lease: float,
                 timeout: float, metrics: Metrics | None = None) -> None:
        self._storage = storage
        self._metrics = metrics
        self._tiers: dict[int, str] = {}  # id(leases) -> tier, while held (for metrics)
        self._fallback = fallback
        self._renewals = _Renewals(lease, self.storage_of)
        # A release awaited on the storage waits at most this long (a second at least: a
        # slot not given back stays taken for its whole lease).
        self._batch = _ReleaseBatch(max(1.0, timeout))
        self._tasks: set[asyncio.Task[None]] = set()

    def storage_of(self, source: Source) -> Storage:
        """The storage whose slots a verdict from ``source`` holds."""
        if source == "fallback" and self._fallback is not None:
            return self._fallback
        return self._storage

    def hold(self, leases: tuple[Lease, ...], source: Source, tier: str = "") -> None:
        """``leases``, granted by the storage of ``source`` to a request of ``tier``, are
        held from now: renewed until ``drop``."""
        self._renewals.hold(leases, source)
        if self._metrics is not None:
            self._tiers[id(leases)] = tier
            self._metrics.slots_in_flight(tier, len(leases))

    def drop(self, leases: tuple[Lease, ...]) -> None:
        """``leases`` are given back (or about to be): no more renewing."""
        self._renewals.drop(leases)
        if self._metrics is not None:
            tier = self._tiers.pop(id(leases), None)
            if tier is not None:
                self._metrics.slots_in_flight(tier, -len(leases))

    def release_now(self, leases: tuple[Lease, ...], source: Source) -> bool:
        """Give ``leases`` back without awaiting, if their storage can (see
        ``Storage.release_now``); False when ``release`` must be awaited."""
        try:
            return self.storage_of(source).release_now(leases, self._not_released)
        except Exception as exc:
            self._not_released(leases, exc)
            return True  # given up on: the lease ends it

    async def release(self, leases: tuple[Lease, ...], source: Source) -> None:
        """Give ``leases`` back; never raises.

        Without awaiting where the storage can; else in one ``release`` call shared by
        the requests ending in the same event-loop iteration, bounded by a timeout. A
        cancelled request can't cut that call off: it goes on without the request.
        """
        if self.release_now(leases, source):
            return
        task = asyncio.current_task()
        cancelling = task is not None and task.cancelling()
        try:
            done = self._batch.submit(self.storage_of(source), leases)
            if cancelling:
                return
            await asyncio.shield(done)
        except Exception as exc:
            self._not_released(leases, exc)

    def _not_released(self, leases: Sequence[Lease], exc: BaseException) -> None:
        """Log (and count) slots that could not be given back."""
        _could_not_release(leases, exc)
        if self._metrics is not None:
            self._metrics.slot_release_failed(len(leases))

    def release_soon(self, leases: tuple[Lease, ...], source: Source) -> None:
        """Give ``leases`` back now if their storage can, else in a task of their own."""
        if not self.release_now(leases, source):
            self._background(self.release(leases, source))

    def _background(self, work: Awaitable[None]) -> None:
        task: asyncio.Task[None] = asyncio.ensure_future(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)


def _could_not_release(leases: Sequence[Lease], exc: BaseException) -> None:
    _log.warning("ratelimit_mw: couldn't give back %d concurrency slot(s) (%s); they "
                 "free themselves when their lease ends", len(leases), describe_error(exc))


class _ReleaseBatch:
    """Gives back the slots of the requests that end in one event-loop iteration
    together, in one ``release`` call per storage bounded by a timeout (on Redis, the
    storage sends them in the pipeline of that iteration's decisions)."""

    __slots__ = ("_batches", "_tasks", "_timeout")

    def __init__(self, timeout: float) -> None:
        self._timeout = timeout
        # id(storage) -> (storage, the leases queued, the future they share)
        self._batches: dict[int, tuple[Storage, list[Lease], asyncio.Future[None]]] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    def submit(self, storage: Storage, leases: tuple[Lease, ...]) -> asyncio.Future[None]:
        """Queue ``leases``; the future resolves once they are back (or failed to be)."""
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
        batch[1].extend(leases)
        return batch[2]

    async def _run(self, storage_id: int) -> None:
        storage, leases, done = self._batches.pop(storage_id)
        try:
            async with asyncio.timeout(self._timeout):
                await storage.release(leases)
        except Exception as exc:
            done.set_exception(exc)
        else:
            done.set_result(None)


def _mark_seen(future: asyncio.Future[None]) -> None:
    """Mark a batch's error as seen (its waiters may all have been cancelled)."""
    if not future.cancelled():
        future.exception()


class _Renewals:
    """The slots held on each event loop, renewed every third of a lease while held.

    A timer per event loop, armed while a slot is held on that loop, starts each round
    of renewals of that loop's slots as tasks of their own (nothing waits on the loop
    in between, and a round that hangs can't hold up the next).
    """

    __slots__ = ("_armed", "_held", "_lease_us", "_rounds", "_storage_of", "_tick")

    def __init__(self, lease: float, storage_of: Callable[[Source], Storage]) -> None:
        self._held: dict[int, tuple[tuple[Lease, ...], Source, asyncio.AbstractEventLoop]] = {}
        self._storage_of = storage_of  # the storage of a verdict's source, found per tick
        self._lease_us = Limit.concurrency(1, lease=lease).period_us
        self._tick = lease / 3
        self._armed: set[asyncio.AbstractEventLoop] = set()
        self._rounds: set[asyncio.Task[None]] = set()

    def hold(self, leases: tuple[Lease, ...], source: Source) -> None:
        loop = asyncio.get_running_loop()
        self._held[id(leases)] = (leases, source, loop)
        if loop not in self._armed:
            # Loops closed with a timer still set (a test client's) are forgotten here.
            self._armed = {armed for armed in self._armed if not armed.is_closed()}
            self._armed.add(loop)
            loop.call_later(self._tick, self._due, loop)

    def drop(self, leases: tuple[Lease, ...]) -> None:
        self._held.pop(id(leases), None)

    def _due(self, loop: asyncio.AbstractEventLoop) -> None:
        """A tick on ``loop``: renew every slot held on it now (a slot is renewed at most
        a third of a lease after it was taken, and twice more before its lease would
        end), and arm the next tick while any is held."""
        due: dict[int, tuple[Storage, list[Lease]]] = {}
        for leases, source, on in self._held.values():
            if on is loop:
                storage = self._storage_of(source)
                due.setdefault(id(storage), (storage, []))[1].extend(leases)
        if not due:
            self._armed.discard(loop)
            return
        # Each storage on its own, within a tick: a Redis that hangs must not hold up
        # the renewals of the memory fallback taking its place.
        for storage, renewing in due.values():
            task = loop.create_task(self._renew(storage, renewing),
                                    name="ratelimit_mw lease renewals")
            self._rounds.add(task)
            task.add_done_callback(self._rounds.discard)
        loop.call_later(self._tick, self._due, loop)

    async def _renew(self, storage: Storage, leases: list[Lease]) -> None:
        try:
            async with asyncio.timeout(self._tick):
                await storage.renew(leases, self._lease_us)
        except Exception as exc:
            _log.warning("ratelimit_mw: couldn't renew %d concurrency slot(s) (%s); they "
                         "end with their lease unless renewed later", len(leases),
                         describe_error(exc))

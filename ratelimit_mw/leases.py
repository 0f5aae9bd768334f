"""Concurrency leases while they are held: renewed every third of a lease.

A slot is a lease: taken with the request's limits in one storage call, renewed while
the request runs (however long: a stream, a websocket), and given back when it ends
(``holds.py``). A worker that dies renews nothing, and its slots end within a lease.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from .decision import Lease
from .events import Source
from .limits import Limit
from .outages import OutageLog
from .storage import Storage

__all__ = ["LeaseRenewals"]


class LeaseRenewals:
    """The slots held on each event loop, renewed every third of a lease while held.

    A timer per event loop, armed while a slot is held on that loop, starts each round
    of renewals of that loop's slots as tasks of their own (nothing waits on the loop
    in between, and a round that hangs can't hold up the next).
    """

    __slots__ = ("_armed", "_failures", "_held", "_lease_us", "_rounds", "_storage_of", "_tick")

    def __init__(self, lease: float, storage_of: Callable[[Source], Storage]) -> None:
        self._held: dict[int, tuple[tuple[Lease, ...], Source, asyncio.AbstractEventLoop]] = {}
        self._storage_of = storage_of  # the storage of a verdict's source, found per tick
        self._lease_us = Limit.concurrency(1, lease=lease).period_us
        self._tick = lease / 3
        self._armed: set[asyncio.AbstractEventLoop] = set()
        self._rounds: set[asyncio.Task[None]] = set()
        self._failures = OutageLog("slot renewal", "slot_renewal_failed",
                                   "slots not renewed end with their lease unless renewed later")

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
            self._failures.failed(exc, len(leases))
        else:
            self._failures.succeeded()

"""In-memory storage: one process, atomic under asyncio, bounded by ``max_keys``."""

from __future__ import annotations

import itertools
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

from mypy_extensions import mypyc_attr

from ..algorithms import run
from ..algorithms.concurrency import renewed, with_lease, without_lease
from ..decision import Lease, Verdict, decision_from
from ..errors import ConfigError
from ..policy import Hit, merge_hits
from ..rates import MAX_AMOUNT
from .base import (
    BUCKET_SECONDS,
    Granularity,
    Storage,
    UsageRetention,
    bad_usage,
    bucket_range,
)

__all__ = ["MemoryStorage"]

_SWEEP = 4  # expired identities reclaimed per insert, from the least recently used end
_new = tuple.__new__
_NO_CELLS: dict[tuple[str, str], tuple[Any, int]] = {}
_HOUR_US, _DAY_US = 3_600_000_000, 86_400_000_000


_TIME = time.time  # the wall clock as imported (a clock patched in later is honoured)


class _Entry:
    """All the counters of one identity, and when the last of them expires."""

    __slots__ = ("cells", "days", "expires", "hours")

    def __init__(self) -> None:
        self.cells: dict[tuple[str, str], tuple[Any, int]] = {}
        self.expires = 0
        # Usage history: admitted requests per hour and per day (since the epoch).
        self.hours: dict[int, int] | None = None
        self.days: dict[int, int] | None = None


@mypyc_attr(allow_interpreted_subclasses=True)
class MemoryStorage(Storage):
    """Counters in a dict, for one process (each worker process counts on its own).

    Decisions never await, so each is atomic on the event loop. Memory is bounded:
    expired counters are reclaimed as new identities arrive, and beyond ``max_keys``
    identities the least recently used one is evicted (with its usage history).

    >>> import asyncio
    >>> from ratelimit_mw import Hit, Limit
    >>> storage = MemoryStorage()
    >>> asyncio.run(storage.decide("client-1", [Hit(Limit("2/minute"))])).allowed
    True
    """

    __slots__ = ("_clock", "_keys", "_leases", "max_keys", "retention")

    def __init__(
        self, *, max_keys: object = 100_000, clock: Callable[[], float] | None = None,
        usage_retention: UsageRetention | Sequence[int] = UsageRetention(),  # noqa: B008
    ) -> None:
        # max_keys typed object: see ``ratelimit_mw.checks``.
        if isinstance(max_keys, bool) or not isinstance(max_keys, int) or max_keys < 1:
            msg = f"max_keys must be a positive integer, got {max_keys!r}"
            raise ConfigError(msg)
        self.max_keys = max_keys
        self.retention = UsageRetention(*usage_retention).check()
        self._clock = None if clock is _TIME else clock
        self._keys: OrderedDict[str, _Entry] = OrderedDict()
        self._leases = itertools.count(1)

    def _now(self) -> int:
        """The clock in whole microseconds."""
        clock = self._clock
        if clock is None:
            return time.time_ns() // 1000
        return round(clock() * 1_000_000)

    def __repr__(self) -> str:
        return f"MemoryStorage(keys={len(self._keys)}, max_keys={self.max_keys})"

    def __len__(self) -> int:
        return len(self._keys)

    async def decide(self, key: str, hits: Sequence[Hit], *, usage: int = 0) -> Verdict:
        return MemoryStorage.decide_now(self, key, hits, usage)

    def decide_now(self, key: str, hits: Sequence[Hit], usage: int = 0) -> Verdict:
        """The whole decision, without awaiting: see ``Storage.decide_now``."""
        if usage and not 0 < usage <= MAX_AMOUNT:  # checked before anything is charged
            raise bad_usage(usage)
        now = self._now()
        keys = self._keys
        entry = keys.get(key)
        if entry is not None:
            keys.move_to_end(key)
            cells = entry.cells
        else:
            cells = _NO_CELLS
        if len(hits) == 1:
            return self._decide_one(key, entry, cells, hits[0], now, usage)
        hits = merge_hits(hits)
        steps = []
        allowed = True
        for hit in hits:
            limit = hit.limit
            cell = cells.get(hit.slot)
            step = run(limit, cell[0] if cell is not None and cell[1] > now else None, now,
                       hit.cost)
            steps.append(step)
            if not step[0]:
                allowed = False
        leases: tuple[Lease, ...] = ()
        if allowed:
            for hit, step in zip(hits, steps):  # noqa: B905 - one step per hit
                if hit.cost:
                    entry, lease = self._take(key, entry, hit, step[4], step[2], now)
                    if lease is not None:
                        leases = (*leases, lease)
            if usage:
                if entry is None:
                    entry = self._insert(key, now)
                self._count(entry, now, usage)
        elif len(hits) > 1:
            # Report what the admitted limits look like without this request's cost.
            for i, hit in enumerate(hits):
                if steps[i][0] and hit.cost:
                    limit = hit.limit
                    cell = cells.get(hit.slot)
                    steps[i] = run(
                        limit, cell[0] if cell is not None and cell[1] > now else None, now, 0)
        # tuple.__new__ skips the named tuple's Python-level __new__: this runs per request.
        return _new(Verdict, (allowed, tuple([
            decision_from(hit, step[0], step[1], step[2], step[3])
            for hit, step in zip(hits, steps)]), leases, now / 1_000_000))  # noqa: B905

    def _decide_one(self, key: str, entry: _Entry | None, cells: dict[tuple[str, str], Any],
                    hit: Hit, now: int, usage: int) -> Verdict:
        """``decide_now`` for a single hit: the same steps, without the loops."""
        limit = hit.limit
        cell = cells.get(hit.slot)
        allowed, remaining, reset, retry, state = run(
            limit, cell[0] if cell is not None and cell[1] > now else None, now, hit.cost)
        leases: tuple[Lease, ...] = ()
        if allowed:
            if hit.cost:
                entry, lease = self._take(key, entry, hit, state, reset, now)
                if lease is not None:
                    leases = (lease,)
            if usage:
                if entry is None:
                    entry = self._insert(key, now)
                self._count(entry, now, usage)
        return _new(Verdict, (allowed, (decision_from(hit, allowed, remaining, reset, retry),),
                              leases, now / 1_000_000))

    def _take(self, key: str, entry: _Entry | None, hit: Hit, state: Any, reset: int,
              now: int) -> tuple[_Entry, Lease | None]:
        """Keep an admitted hit's new state until it resets (with the slot it took, for
        a concurrency limit); the identity's entry, created if new, and the lease."""
        if entry is None:
            entry = self._insert(key, now)
        lease = None
        limit = hit.limit
        if limit.is_concurrency:
            lease = _new(Lease, (key, hit.scope, limit.uid, str(next(self._leases))))
            state = with_lease(state, now, limit.period_us, lease.id)
        expires = now + reset
        entry.cells[hit.slot] = (state, expires)
        if expires > entry.expires:
            entry.expires = expires
        return entry, lease

    def _count(self, entry: _Entry, now: int, units: int) -> None:
        """Add an admitted request's ``units`` to the hour and day buckets of ``now``."""
        hours, days = entry.hours, entry.days
        if hours is None or days is None:
            hours, days = entry.hours, entry.days = {}, {}
        hour, day = now // _HOUR_US, now // _DAY_US
        hours[hour] = hours.get(hour, 0) + units
        days[day] = days.get(day, 0) + units
        _forget_before(hours, hour - self.retention.hours, self.retention.hours)
        _forget_before(days, day - self.retention.days, self.retention.days)
        # Usage outlives the counters: keep the identity as long as its history (the
        # hourly buckets' retention may be the longer one).
        kept = max((day + self.retention.days) * _DAY_US,
                   (hour + self.retention.hours) * _HOUR_US)
        if kept > entry.expires:
            entry.expires = kept

    def _insert(self, key: str, now: int) -> _Entry:
        self._reclaim(now)
        entry = self._keys[key] = _Entry()
        if len(self._keys) > self.max_keys:
            self._keys.popitem(last=False)
        return entry

    def _reclaim(self, now: int) -> None:
        """Drop a few expired identities from the least recently used end."""
        keys = self._keys
        for _ in range(_SWEEP):
            if not keys:
                return
            oldest = next(iter(keys))
            if keys[oldest].expires > now:
                return
            del keys[oldest]

    async def release(self, leases: Sequence[Lease]) -> None:
        self._release(leases)

    def release_now(
        self, leases: Sequence[Lease],
        on_failure: Callable[[Sequence[Lease], BaseException], None],
    ) -> bool:
        """Give the slots back at once: see ``Storage.release_now`` (this never fails)."""
        self._release(leases)
        return True

    async def renew(self, leases: Sequence[Lease], period_us: int) -> None:
        now = self._now()
        for lease in leases:
            entry = self._keys.get(lease.key)
            slot = (lease.scope, lease.uid)
            cell = entry.cells.get(slot) if entry is not None else None
            if entry is None or cell is None or cell[1] <= now:
                continue
            self._keys.move_to_end(lease.key)  # in use: the last identity to evict
            state = renewed(cell[0], now, period_us, lease.id)
            if state is not cell[0]:
                expires = max(cell[1], now + period_us)
                entry.cells[slot] = (state, expires)
                if expires > entry.expires:
                    entry.expires = expires

    def _release(self, leases: Sequence[Lease]) -> None:
        for lease in leases:
            entry = self._keys.get(lease.key)
            cell = entry.cells.get((lease.scope, lease.uid)) if entry is not None else None
            if entry is not None and cell is not None:
                entry.cells[(lease.scope, lease.uid)] = (without_lease(cell[0], lease.id), cell[1])

    async def usage(
        self, key: str, granularity: Granularity, start: float, end: float,
    ) -> list[tuple[int, int]]:
        now = self._now() / 1_000_000
        buckets = bucket_range(granularity, start, end, now, self.retention)
        entry = self._keys.get(key)
        counts: dict[int, int] | None = None
        if entry is not None:
            counts = entry.hours if granularity == "hour" else entry.days
        if counts is None:
            counts = {}
        size = BUCKET_SECONDS[granularity]
        return [(n * size, counts.get(n, 0)) for n in buckets]

    async def reset(self, key: str) -> None:
        self._keys.pop(key, None)

    def clear(self) -> None:
        """Forget every counter."""
        self._keys.clear()


def _forget_before(counts: dict[int, int], oldest: int, kept: int) -> None:
    """Drop the buckets numbered ``oldest`` or lower, once there are more than ``kept``."""
    if len(counts) > kept:
        for bucket in [b for b in counts if b <= oldest]:
            del counts[bucket]

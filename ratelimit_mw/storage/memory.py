"""In-memory storage: one process, atomic under asyncio, bounded by ``max_keys``."""

from __future__ import annotations

import itertools
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any, ClassVar, Final

from mypy_extensions import mypyc_attr

from ..algorithms.base import RawStep
from ..algorithms.concurrency import renewed, with_lease, without_lease
from ..decision import Adjustment, Hold, Lease, Verdict, decision_from
from ..errors import ConfigError
from ..hits import Hit, Slot, merge_hits
from ..limits import run, settle
from ..rates import MAX_AMOUNT
from .base import Granularity, Storage, UsageRetention, bad_usage, bucket_range
from .entries import EMPTY, FIRST_CELL, Entry, cell_state, find_cell, in_entry_order, with_cell
from .histories import Histories

__all__ = ["MemoryStorage"]

_SWEEP: Final = 4  # expired identities reclaimed per insert, from the least recently used end
_EDGES: Final = 4096  # windowed counters' shared edges kept, one per slot
_TIME: Final = time.time  # the wall clock as imported (a clock patched in later is honoured)
_TIME_NS: Final = time.time_ns
def _never(holds: Sequence[Hold], error: BaseException) -> None:
    """Nothing fails later in this process: settling here is done when it returns."""


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

    __slots__ = ("_clock", "_edges", "_histories", "_keys", "_leases", "max_keys",
                 "retention")

    shared: ClassVar[bool] = False

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
        self._histories = Histories(self.retention)
        self._edges: dict[Slot, tuple[Any, Any]] = {}
        self._clock = None if clock is _TIME else clock
        self._keys: OrderedDict[str, Entry] = OrderedDict()
        self._leases = itertools.count(1)

    def _now(self) -> int:
        """The clock in whole microseconds."""
        clock = self._clock
        if clock is None:
            return _TIME_NS() // 1000
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
        if len(hits) == 1:
            return self._decide_one(key, entry, hits[0], now, usage)
        hits = merge_hits(hits)
        kept = entry if entry is not None else EMPTY
        # Where each hit's cell is in the entry (-1: none yet). A limit set keeps its cells in
        # the order of its hits, so the cell after the last one found is tried first.
        spots: list[int] = []
        steps: list[RawStep] = []  # typed: compiled, each read without boxing
        allowed = ordered = True
        size, guess = len(kept), FIRST_CELL
        for hit in hits:
            slot = hit.slot
            # Compared by identity first: a tuple's == compares its items, and an entry
            # keeps the slot object of the hit that made it.
            i = guess if guess < size and (kept[guess] is slot or kept[guess] == slot) else (
                find_cell(kept, slot))
            if i >= 0:
                if i < guess:
                    ordered = False
                items: int = kept[i + 2]
                guess = i + 3 + items
            spots.append(i)
            step = run(hit.limit, cell_state(kept, i, now), now, hit.cost)
            steps.append(step)
            if not step[0]:
                allowed = False
        leases: tuple[Lease, ...] = ()
        if allowed:
            # The new entry made in one pass over the old one: the cells before each
            # changed cell copied as they are, the changed cell written in its place, the
            # cells added last. Cells the hits name out of the entry's order (a route's
            # limits before its tier's, say) are written in the entry's order.
            cells: list[Any] = [kept[0]]
            added: list[Any] = []
            copied = FIRST_CELL  # kept's cells before this index are in ``cells``
            held: list[tuple[int, Lease]] = []
            for k in range(len(hits)) if ordered else in_entry_order(spots):
                hit = hits[k]
                if not hit.cost:
                    continue
                step = steps[k]
                state = step[4]
                lease: Lease | None = None
                if hit.limit.is_concurrency:
                    state, lease = self._leased(key, hit, state, now)
                ends: Any = now + step[2]  # boxed once (see with_cell)
                if hit.limit.windowed:
                    state, ends = self._shared(hit.slot, state, ends)
                if ends > cells[0]:
                    cells[0] = ends
                i = spots[k]
                into = added
                if i >= 0:
                    into = cells
                    while copied < i:
                        cells.append(kept[copied])
                        copied += 1
                    items = kept[i + 2]
                    copied = i + 3 + items
                into.append(hit.slot)
                into.append(ends)
                if state is None:
                    into.append(0)
                else:
                    into.append(len(state))
                    into.extend(state)
                if lease is not None:
                    held.append((k, lease))
            if len(cells) > 1 or added or usage:
                while copied < size:
                    cells.append(kept[copied])
                    copied += 1
                cells.extend(added)
                if usage:
                    kept_until = self._histories.count(key, now, usage, hits)
                    if kept_until > cells[0]:
                        cells[0] = kept_until
                self._store(key, entry, tuple(cells), 0, now)
            if held:
                leases = tuple(lease for _, lease in (held if ordered else sorted(held)))
        elif len(hits) > 1:
            # Report what the admitted limits look like without this request's cost.
            for k, hit in enumerate(hits):
                if steps[k][0] and hit.cost:
                    i = spots[k]
                    steps[k] = run(hit.limit, cell_state(kept, i, now), now, 0)
        return Verdict(allowed, tuple([
            decision_from(hit, step[0], step[1], step[2], step[3])
            for hit, step in zip(hits, steps)]), leases, now / 1_000_000)  # noqa: B905

    def _decide_one(self, key: str, entry: Entry | None, hit: Hit, now: int,
                    usage: int) -> Verdict:
        """``decide_now`` for a single hit: the same steps, without the loops."""
        slot = hit.slot
        kept = entry if entry is not None else EMPTY
        i = find_cell(kept, slot)
        allowed, remaining, reset, retry, state = run(hit.limit, cell_state(kept, i, now), now,
                                                      hit.cost)
        leases: tuple[Lease, ...] = ()
        if allowed and (hit.cost or usage):
            if hit.cost:
                lease: Lease | None = None
                if hit.limit.is_concurrency:
                    state, lease = self._leased(key, hit, state, now)
                ends: Any = now + reset
                if hit.limit.windowed:
                    state, ends = self._shared(slot, state, ends)
                kept = with_cell(kept, i, slot, state, ends)
                if lease is not None:
                    leases = (lease,)
            self._store(key, entry, kept, usage, now, (hit,))
        return Verdict(allowed, (decision_from(hit, allowed, remaining, reset, retry),),
                           leases, now / 1_000_000)

    settles: ClassVar[bool] = True

    async def settle(self, adjustments: Sequence[Adjustment]) -> None:
        MemoryStorage.settle_now(self, adjustments, _never)

    def settle_now(
        self, adjustments: Sequence[Adjustment],
        on_failure: Callable[[Sequence[Hold], BaseException], None],
    ) -> bool:
        """See ``Storage.settle``: each counter moved at once, in this process."""
        now = self._now()
        keys = self._keys
        counted: set[tuple[str, str, float]] = set()  # a request's unit, once in its history
        for key, hit, delta, at in adjustments:
            entry = keys.get(key)
            kept = entry if entry is not None else EMPTY
            unit = hit.limit.unit
            if unit != "requests" and (key, unit, at) not in counted:
                counted.add((key, unit, at))
                self._histories.settle(key, unit, round(at * 1_000_000), delta)
            i = find_cell(kept, hit.slot)
            state = cell_state(kept, i, now)
            settled = settle(hit.limit, state, now, round(at * 1_000_000), delta)
            if settled is state:
                continue
            ends = now + run(hit.limit, settled, now, 0)[2] if settled is not None else now
            self._store(key, entry, with_cell(kept, i, hit.slot, settled, ends), 0, now)
        return True

    def _shared(self, slot: Slot, state: Any, ends: Any) -> tuple[Any, Any]:
        """A windowed counter's ``state`` and ``ends`` holding the same objects for the
        window's start and edge as the last counter of ``slot`` kept: every identity
        counted in one window then shares two numbers (64 bytes an identity)."""
        edges = self._edges
        last = edges.get(slot)
        if last is None or last[1] != state[0]:
            if last is None and len(edges) >= _EDGES:
                edges.clear()
            edges[slot] = (ends, state[0])
            return state, ends
        ends = last[0] if last[0] == ends else ends
        # A window's usual two or three items written out: compiled, a starred tuple is
        # built as a list.
        items = len(state)
        if items == 2:
            return (last[1], state[1]), ends
        if items == 3:
            return (last[1], state[1], state[2]), ends
        return (last[1], *state[1:]), ends

    def _leased(self, key: str, hit: Hit, state: Any, now: int) -> tuple[Any, Lease]:
        """An admitted concurrency hit's state as kept, and the slot it took."""
        limit = hit.limit
        lease = Lease(key, hit.scope, limit.uid, str(next(self._leases)))
        return with_lease(state, now, limit.period_us, lease.id), lease

    def _store(self, key: str, old: Entry | None, entry: Entry, usage: int, now: int,
               hits: Sequence[Hit] = ()) -> None:
        """Keep an identity's new ``entry`` (``old`` if it had one), with ``usage`` units
        of an admitted request (and what its ``hits`` spend of other units) added to its
        history."""
        keys = self._keys
        if old is None:
            self._reclaim(now)
        if usage:
            kept = self._histories.count(key, now, usage, hits)
            if kept > entry[0]:  # usage outlives the counters: keep the identity as long
                entry = (kept, *entry[1:])
        keys[key] = entry
        if old is None and len(keys) > self.max_keys:
            self._histories.forget(keys.popitem(last=False)[0])

    def _reclaim(self, now: int) -> None:
        """Drop a few expired identities from the least recently used end."""
        keys = self._keys
        for _ in range(_SWEEP):
            if not keys:
                return
            oldest = next(iter(keys))
            if keys[oldest][0] > now:
                return
            del keys[oldest]
            self._histories.forget(oldest)

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
        keys = self._keys
        for lease in leases:
            entry = keys.get(lease.key)
            if entry is None:
                continue
            i = find_cell(entry, (lease.scope, lease.uid))
            held = cell_state(entry, i, now)
            if held is None:
                continue
            keys.move_to_end(lease.key)  # in use: the last identity to evict
            state = renewed(held, now, period_us, lease.id)
            if state is not held:
                expires = max(entry[i + 1], now + period_us)
                keys[lease.key] = with_cell(entry, i, entry[i], state, expires)

    def _release(self, leases: Sequence[Lease]) -> None:
        keys = self._keys
        for lease in leases:
            entry = keys.get(lease.key)
            if entry is None:
                continue
            i = find_cell(entry, (lease.scope, lease.uid))
            if i >= 0:
                state = without_lease(entry[i + 3:i + 3 + entry[i + 2]], lease.id)
                keys[lease.key] = with_cell(entry, i, entry[i], state, entry[i + 1])

    async def usage(
        self, key: str, granularity: Granularity, start: float, end: float,
        unit: str = "requests",
    ) -> list[tuple[int, int]]:
        now = self._now() / 1_000_000
        buckets = bucket_range(granularity, start, end, now, self.retention)
        return self._histories.read(key, granularity, buckets, unit)

    async def reset(self, key: str) -> None:
        self._keys.pop(key, None)
        self._histories.forget(key)

    def clear(self) -> None:
        """Forget every counter."""
        self._keys.clear()
        self._histories.clear()


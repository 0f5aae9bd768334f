"""In-memory storage: one process, atomic under asyncio, bounded by ``max_keys``."""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

from ..decision import Verdict
from ..errors import ConfigError
from ..limit import Hit
from .base import Storage, decision_from, merge_hits

__all__ = ["MemoryStorage"]

_SWEEP = 4  # expired identities reclaimed per call, from the least recently used end
_new = tuple.__new__
_NO_CELLS: dict[tuple[str, str], tuple[Any, int]] = {}


def _wall_us() -> int:
    """The wall clock in whole microseconds."""
    return time.time_ns() // 1000


class _Entry:
    """All the counters of one identity, and when the last of them expires."""

    __slots__ = ("cells", "expires")

    def __init__(self) -> None:
        self.cells: dict[tuple[str, str], tuple[Any, int]] = {}
        self.expires = 0


class MemoryStorage(Storage):
    """Counters in a dict, for one process (each worker process counts on its own).

    Decisions never await, so each is atomic on the event loop. Memory is bounded:
    expired counters are reclaimed as calls pass, and beyond ``max_keys`` identities
    the least recently used one is evicted.

    >>> import asyncio
    >>> from ratelimit_mw import Hit, Limit
    >>> storage = MemoryStorage()
    >>> asyncio.run(storage.decide("client-1", [Hit(Limit.parse("2/minute"))])).allowed
    True
    """

    __slots__ = ("_clock", "_keys", "_now", "max_keys")

    def __init__(
        self, *, max_keys: int = 100_000, clock: Callable[[], float] | None = None,
    ) -> None:
        if isinstance(max_keys, bool) or not isinstance(max_keys, int) or max_keys < 1:
            msg = f"max_keys must be a positive integer, got {max_keys!r}"
            raise ConfigError(msg)
        self.max_keys = max_keys
        self._clock = clock
        self._now: Callable[[], int] = (
            _wall_us if clock is None else lambda: round(clock() * 1_000_000))
        self._keys: OrderedDict[str, _Entry] = OrderedDict()

    def __repr__(self) -> str:
        return f"MemoryStorage(keys={len(self._keys)}, max_keys={self.max_keys})"

    def __len__(self) -> int:
        return len(self._keys)

    async def decide(self, key: str, hits: Sequence[Hit]) -> Verdict:
        return self.decide_now(key, hits)

    def decide_now(self, key: str, hits: Sequence[Hit]) -> Verdict:
        """The synchronous core of ``decide`` (the whole decision, without awaiting)."""
        now = self._now()
        keys = self._keys
        entry = keys.get(key)
        if entry is not None:
            keys.move_to_end(key)
            cells = entry.cells
        else:
            cells = _NO_CELLS
        if len(hits) > 1:
            hits = merge_hits(hits)
        steps = []
        allowed = True
        for hit in hits:
            limit = hit.limit
            cell = cells.get(hit.slot)
            step = limit.step(cell[0] if cell is not None and cell[1] > now else None, now,
                              limit.amount, limit.period_us, limit.capacity, hit.cost)
            steps.append(step)
            if not step[0]:
                allowed = False
        if allowed:
            for i, hit in enumerate(hits):
                if hit.cost:
                    if entry is None:
                        entry = self._insert(key, now)
                    step = steps[i]
                    expires = now + step[2]
                    entry.cells[hit.slot] = (step[4], expires)
                    if expires > entry.expires:
                        entry.expires = expires
        else:
            # Report what the admitted limits look like without this request's cost.
            for i, hit in enumerate(hits):
                if steps[i][0] and hit.cost:
                    limit = hit.limit
                    cell = cells.get(hit.slot)
                    steps[i] = limit.step(
                        cell[0] if cell is not None and cell[1] > now else None, now,
                        limit.amount, limit.period_us, limit.capacity, 0)
        if len(hits) == 1:
            step = steps[0]
            return _new(Verdict, (allowed, (
                decision_from(hits[0], step[0], step[1], step[2], step[3]),)))
        return _new(Verdict, (allowed, tuple([
            decision_from(hit, step[0], step[1], step[2], step[3])
            for hit, step in zip(hits, steps, strict=True)
        ])))

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

    async def reset(self, key: str) -> None:
        self._keys.pop(key, None)

    def clear(self) -> None:
        """Forget every counter."""
        self._keys.clear()

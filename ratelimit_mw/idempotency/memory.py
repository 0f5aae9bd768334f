"""Idempotency records in dicts: one process, an injectable clock, bounded size."""

from __future__ import annotations

import time
import uuid
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from ..errors import ConfigError, StorageError
from .store import Claim, IdempotencyStore, StoredResponse

__all__ = ["MemoryIdempotencyStore"]


@dataclass(slots=True)
class _Record:
    fingerprint: str
    token: str  # the lease holder's, kept once done
    expires_at: float
    response: StoredResponse | None = None  # None while in flight


_Records = OrderedDict[str, _Record]


def _drop_expired(records: _Records, now: float) -> None:
    """Drop the expired records at the front of ``records`` (kept in expiry order)."""
    while records and next(iter(records.values())).expires_at <= now:
        records.popitem(last=False)


class MemoryIdempotencyStore(IdempotencyStore):
    """Keys and responses of this process only; for tests and single-worker apps.

    ``clock`` gives wall seconds (``time.time``). Leases and finished responses are
    kept apart, each in expiry order (every change moves a record to the end), so
    expired records are dropped from the front at each claim, at no cost to the
    others. At ``max_entries`` records, the finished response nearest its expiry is
    forgotten to make room; a lease in flight never is: when every record is one,
    the claim fails with ``StorageError``, as a store that is down would.
    """

    __slots__ = ("_clock", "_done", "_leases", "_max_entries")

    def __init__(
        self, *, clock: Callable[[], float] = time.time, max_entries: int = 100_000
    ) -> None:
        if isinstance(max_entries, bool) or not isinstance(max_entries, int) or max_entries < 1:
            msg = f"max_entries must be an integer >= 1, got {max_entries!r}"
            raise ConfigError(msg)
        self._clock = clock
        self._max_entries = max_entries
        self._leases: _Records = OrderedDict()
        self._done: _Records = OrderedDict()

    def __repr__(self) -> str:
        return (f"<MemoryIdempotencyStore {len(self._leases)} in flight, "
                f"{len(self._done)} done>")

    def __len__(self) -> int:
        return len(self._leases) + len(self._done)

    def _live(self, key: str, now: float) -> _Record | None:
        """The record of ``key`` unless it has expired (then it is dropped)."""
        for records in (self._leases, self._done):
            record = records.get(key)
            if record is not None:
                if record.expires_at > now:
                    return record
                # Met out of order: a record with a shorter ttl was added after it.
                del records[key]
        return None

    def _make_room(self) -> None:
        """Forget finished responses, soonest to expire first, until one more record fits."""
        while len(self) >= self._max_entries:
            if not self._done:
                msg = (f"the memory idempotency store is full: {len(self._leases)} requests "
                       f"are in flight (max_entries={self._max_entries})")
                raise StorageError(msg)
            self._done.popitem(last=False)

    async def claim(self, key: str, fingerprint: str, *, lock_ttl: float) -> Claim:
        now = self._clock()
        _drop_expired(self._leases, now)
        _drop_expired(self._done, now)
        record = self._live(key, now)
        if record is None:
            self._make_room()
            token = uuid.uuid4().hex
            self._leases[key] = _Record(fingerprint, token, now + lock_ttl)
            return Claim("claimed", token)
        if record.fingerprint != fingerprint:
            return Claim("mismatch")
        if record.response is None:
            return Claim("in_flight")
        return Claim("done", response=record.response)

    async def complete(
        self, key: str, token: str, fingerprint: str, response: StoredResponse, *, ttl: float
    ) -> bool:
        now = self._clock()
        record = self._live(key, now)
        if record is not None and record.token != token:
            return False
        if record is not None and record.response is not None:
            return True  # stored already
        # Absent means our lease ran out and nobody claimed since: the response still counts.
        self._leases.pop(key, None)
        self._done[key] = _Record(fingerprint, token, now + ttl, response)
        return True

    async def renew(self, key: str, token: str, *, lock_ttl: float) -> bool:
        now = self._clock()
        record = self._live(key, now)
        if record is None or record.response is not None or record.token != token:
            return False
        record.expires_at = now + lock_ttl
        self._leases.move_to_end(key)
        return True

    async def release(self, key: str, token: str) -> None:
        record = self._leases.get(key)
        if record is not None and record.token == token:
            del self._leases[key]

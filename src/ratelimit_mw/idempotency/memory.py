"""Idempotency records in a dict: one process, an injectable clock, bounded size."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass

from ..errors import ConfigError
from .store import Claim, IdempotencyStore, StoredResponse

__all__ = ["MemoryIdempotencyStore"]


@dataclass(slots=True)
class _Record:
    fingerprint: str
    token: str  # the lease holder; "" once done
    expires_at: float
    response: StoredResponse | None = None


class MemoryIdempotencyStore(IdempotencyStore):
    """Keys and responses of this process only; for tests and single-worker apps.

    ``clock`` gives wall seconds (``time.time``); expired records are dropped
    when met and swept every ``sweep_every`` claims. Beyond ``max_entries``
    records the oldest is forgotten, so memory stays bounded.
    """

    __slots__ = ("_claims", "_clock", "_max_entries", "_records", "_sweep_every")

    def __init__(
        self,
        *,
        clock: Callable[[], float] = time.time,
        max_entries: int = 100_000,
        sweep_every: int = 1_000,
    ) -> None:
        for name, value in (("max_entries", max_entries), ("sweep_every", sweep_every)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                msg = f"{name} must be an integer >= 1, got {value!r}"
                raise ConfigError(msg)
        self._clock = clock
        self._max_entries = max_entries
        self._sweep_every = sweep_every
        self._records: dict[str, _Record] = {}
        self._claims = 0

    def __repr__(self) -> str:
        return f"<MemoryIdempotencyStore {len(self._records)} records>"

    def __len__(self) -> int:
        return len(self._records)

    def _live(self, key: str, now: float) -> _Record | None:
        """The record of ``key`` unless it has expired (then it is dropped)."""
        record = self._records.get(key)
        if record is not None and record.expires_at <= now:
            del self._records[key]
            return None
        return record

    def _make_room(self, now: float) -> None:
        """Sweep expired records now and then; forget the oldest ones when full."""
        self._claims += 1
        if self._claims % self._sweep_every == 0 or len(self._records) >= self._max_entries:
            for key in [k for k, r in self._records.items() if r.expires_at <= now]:
                del self._records[key]
        while len(self._records) >= self._max_entries:
            del self._records[next(iter(self._records))]

    async def claim(self, key: str, fingerprint: str, *, lock_ttl: float) -> Claim:
        now = self._clock()
        record = self._live(key, now)
        if record is None:
            self._make_room(now)
            token = uuid.uuid4().hex
            self._records[key] = _Record(fingerprint, token, now + lock_ttl)
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
        if record is not None and (record.response is not None or record.token != token):
            return False
        # Absent means our lease ran out and nobody claimed since: the response still counts.
        self._records.pop(key, None)  # re-insert at the end: the oldest-first order holds
        self._records[key] = _Record(fingerprint, "", now + ttl, response)
        return True

    async def release(self, key: str, token: str) -> None:
        record = self._records.get(key)
        if record is not None and record.response is None and record.token == token:
            del self._records[key]

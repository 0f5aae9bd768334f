"""What an idempotency store keeps per key: an in-flight lease, then the finished response."""

from __future__ import annotations

import abc
import json
from dataclasses import dataclass
from typing import Literal

__all__ = ["Claim", "ClaimOutcome", "IdempotencyStore", "StoredResponse"]

ClaimOutcome = Literal["claimed", "in_flight", "mismatch", "done"]


@dataclass(frozen=True, slots=True)
class StoredResponse:
    """A finished response as the app sent it: status, raw header pairs and the whole body."""

    status: int
    headers: tuple[tuple[bytes, bytes], ...]
    body: bytes

    def __str__(self) -> str:
        return f"{self.status} with {len(self.body)} body bytes"

    def headers_json(self) -> str:
        """The headers as a JSON list of ``[name, value]`` (bytes read as latin-1)."""
        return json.dumps([[k.decode("latin-1"), v.decode("latin-1")] for k, v in self.headers])

    @staticmethod
    def headers_from_json(text: str | bytes) -> tuple[tuple[bytes, bytes], ...]:
        """The inverse of `headers_json`."""
        return tuple((k.encode("latin-1"), v.encode("latin-1")) for k, v in json.loads(text))


@dataclass(frozen=True, slots=True)
class Claim:
    """The answer to a claim: ours now (with the lease ``token``), busy, reused, or done.

    ``"claimed"``: run the request, renewing the lease, then `IdempotencyStore.complete`
    or ``release``.
    ``"in_flight"``: another request with this key and fingerprint is running.
    ``"mismatch"``: the key was used for a different request.
    ``"done"``: ``response`` is the stored answer to replay.
    """

    outcome: ClaimOutcome
    token: str = ""
    response: StoredResponse | None = None

    def __str__(self) -> str:
        return self.outcome if self.response is None else f"{self.outcome}: {self.response}"


class IdempotencyStore(abc.ABC):
    """Where keys are claimed and responses kept; each method is one atomic step.

    ``key`` is already scoped to the caller and hashed by the middleware. The
    lease taken by `claim` expires after ``lock_ttl`` seconds unless renewed, so a
    worker that dies never wedges its key. Backend failures are raised as
    ``ratelimit_mw.StorageError``.
    """

    __slots__ = ()

    @abc.abstractmethod
    async def claim(self, key: str, fingerprint: str, *, lock_ttl: float) -> Claim:
        """Take ``key`` for a request with ``fingerprint``, or say why not."""

    @abc.abstractmethod
    async def complete(
        self, key: str, token: str, fingerprint: str, response: StoredResponse, *, ttl: float
    ) -> bool:
        """Keep ``response`` for ``ttl`` seconds; False if another request holds the key now.

        Calling it again with the same ``token`` after it stored (an earlier call that
        seemed to fail but ran) is True and changes nothing.
        """

    async def renew(self, key: str, token: str, *, lock_ttl: float) -> bool:
        """Extend the lease ``token`` on ``key`` to ``lock_ttl`` seconds from now; False
        if it is not in flight with that token any more (stored, released or lost).

        A store that can't extend a lease keeps this default: False, so the lease
        runs its ``lock_ttl`` from the claim (make that longer than your slowest
        handler)."""
        return False

    @abc.abstractmethod
    async def release(self, key: str, token: str) -> None:
        """Drop the lease ``token`` on ``key`` without storing anything (no-op if not ours)."""

    @property
    def retry_after(self) -> int:
        """Whole seconds a client refused because the store failed should wait (at least 1)."""
        return 1

    async def close(self) -> None:  # noqa: B027 - most stores hold nothing to close
        """Release connections; the default has none."""

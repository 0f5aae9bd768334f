"""What a storage answers: one decision per limit, and the verdict for the request."""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from typing import Any, ClassVar, Final, NamedTuple, TypeVar

from .hits import Hit
from .limits import Limit

__all__ = ["NEVER", "Adjustment", "Decision", "Hold", "Lease", "Verdict", "binding_of",
           "decision_from"]

NEVER: Final = math.inf
"""``retry_after`` of a request whose cost is larger than the limit can ever admit."""


R = TypeVar("R", bound="Record")


class Record:
    """A value of named fields that reads like the named tuple it replaces: unpacked,
    indexed, compared and hashed by its fields, with ``_fields``, ``_asdict`` and
    ``_replace``. A class of its own, not a tuple: compiled, one is made with its
    fields set in place, where a tuple subclass is copied through ``tuple.__new__``."""

    __slots__ = ()
    _fields: ClassVar[tuple[str, ...]] = ()

    def _values(self) -> tuple[object, ...]:
        return tuple([getattr(self, name) for name in self._fields])

    def __iter__(self) -> Iterator[Any]:
        return iter(self._values())

    def __len__(self) -> int:
        return len(self._fields)

    def __getitem__(self, index: int) -> Any:
        return self._values()[index]

    def __eq__(self, other: object) -> bool:
        if type(other) is type(self):
            assert isinstance(other, Record)
            return self._values() == other._values()
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self._values())

    def __repr__(self) -> str:
        fields = ", ".join([f"{name}={value!r}" for name, value in self._asdict().items()])
        return f"{type(self).__name__}({fields})"

    def _asdict(self) -> dict[str, Any]:
        return dict(zip(self._fields, self._values(), strict=True))

    def _replace(self: R, **changes: Any) -> R:
        return type(self)(**{**self._asdict(), **changes})

    def __reduce__(self) -> tuple[Any, ...]:
        # Compiled, the class has no instance dict for pickle and copy to fill in.
        return (type(self), self._values())


class Decision(Record):
    """One limit's answer for one request.

    ``reset_after``: seconds until the quota is fully back. ``retry_after``: seconds
    until this same request would be admitted (0 when allowed, ``NEVER`` when it
    cannot ever be). Waiting exactly ``retry_after`` and trying again is admitted,
    absent other traffic.
    """

    __slots__ = ("allowed", "limit", "quota", "remaining", "reset_after", "retry_after",
                 "scope")
    _fields = ("allowed", "quota", "remaining", "reset_after", "retry_after", "limit", "scope")

    def __init__(self, allowed: bool, quota: int, remaining: int, reset_after: float,
                 retry_after: float, limit: Limit, scope: str = "") -> None:
        self.allowed: Final = allowed
        self.quota: Final = quota
        self.remaining: Final = remaining
        self.reset_after: Final = reset_after
        self.retry_after: Final = retry_after
        self.limit: Final = limit
        self.scope: Final = scope

    @property
    def never(self) -> bool:
        """True when no amount of waiting admits this request."""
        return self.retry_after == NEVER

    def __str__(self) -> str:
        verb = "allowed" if self.allowed else "denied"
        return (f"{verb} by {self.limit}: {self.remaining}/{self.quota} left, "
                f"reset in {self.reset_after:g}s, retry in {self.retry_after:g}s")


class Lease(Record):
    """A concurrency slot held by an admitted request; give it back with ``release``."""

    __slots__ = ("id", "key", "scope", "uid")
    _fields = ("key", "scope", "uid", "id")

    def __init__(self, key: str, scope: str, uid: str, id: str) -> None:
        self.key: Final = key
        self.scope: Final = scope
        self.uid: Final = uid
        self.id: Final = id


class Adjustment(NamedTuple):
    """A reserved charge settled after its response: ``delta`` more units (fewer, when
    negative) on ``hit``'s counter for the caller ``key``, whose request was decided at
    ``at`` (epoch seconds on the storage's clock)."""

    key: str
    hit: Hit
    delta: int
    at: float


Hold = Lease | Adjustment
"""What closing a decision's holds asks of the storage (``Storage.close_holds``): give a
concurrency slot back (its ``Lease``), or settle a reserved charge (an ``Adjustment``,
which also gives back a shaped request's turn: docs/internals.md, "Holds")."""


class Verdict(Record):
    """All the limits of one request, decided together: admitted only if all admit.

    ``leases`` holds the concurrency slots the request took (empty when denied);
    ``at`` is the storage's clock (epoch seconds) when it decided: with Redis, the
    Redis server's, so that epoch times built on it agree across app servers.
    """

    __slots__ = ("allowed", "at", "decisions", "leases")
    _fields = ("allowed", "decisions", "leases", "at")

    def __init__(self, allowed: bool, decisions: tuple[Decision, ...],
                 leases: tuple[Lease, ...] = (), at: float | None = None) -> None:
        self.allowed: Final = allowed
        self.decisions: Final = decisions
        self.leases: Final = leases
        self.at: Final = at

    @property
    def retry_after(self) -> float:
        """Seconds until the request as a whole would be admitted (0 when allowed)."""
        if self.allowed:
            return 0.0
        return max((d.retry_after for d in self.decisions if not d.allowed), default=0.0)

    @property
    def binding(self) -> Decision | None:
        """The decision to report (in single-policy headers, the 429 body, the log):
        see ``binding_of``."""
        return binding_of(self.decisions, self.allowed) if self.decisions else None


def binding_of(decisions: Sequence[Decision], allowed: bool) -> Decision:
    """The decision to report among ``decisions`` (at least one).

    Denied: the longest wait, then the fewest remaining. Admitted: the rate limit
    nearest exhaustion (free concurrency slots are not a quota to pace against, so a
    slot is reported only when the request has no rate limit), then the soonest reset.
    """
    if len(decisions) == 1:
        return decisions[0]
    best: Decision | None = None
    if not allowed:
        for d in decisions:
            if not d.allowed and (best is None or d.retry_after > best.retry_after or (
                    d.retry_after == best.retry_after and d.remaining < best.remaining)):
                best = d
        return best if best is not None else decisions[0]
    best = decisions[0]
    for d in decisions:  # the first against itself changes nothing
        slot, best_slot = d.limit.is_concurrency, best.limit.is_concurrency
        if (slot != best_slot and best_slot) or (slot == best_slot and (
                d.remaining < best.remaining or (
                    d.remaining == best.remaining and d.reset_after < best.reset_after))):
            best = d
    return best


def decision_from(
    hit: Hit, allowed: bool, remaining: int, reset_us: int, retry_us: int,
) -> Decision:
    """Build a public decision from an algorithm step in microseconds (-1 retry: never)."""
    limit = hit.limit
    return Decision(allowed, limit.capacity, remaining if remaining > 0 else 0,
                    reset_us / 1_000_000, retry_us / 1_000_000 if retry_us >= 0 else NEVER,
                    limit, hit.scope)

"""The storage interface: every limit of one request decided in one atomic call."""

from __future__ import annotations

import asyncio
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from typing import Any, ClassVar, Literal, NamedTuple

from ..decision import Adjustment, Hold, Lease, Verdict
from ..errors import ConfigError, StorageError
from ..hits import Hit
from ..rates import MAX_AMOUNT

__all__ = ["BUCKET_SECONDS", "Granularity", "Storage", "UsageRetention"]

Granularity = Literal["hour", "day"]
BUCKET_SECONDS: dict[Granularity, int] = {"hour": 3600, "day": 86400}

DEFAULT_MAX_CONNECTIONS = 100
"""Connections to one Redis server (redis-py's own default); callers beyond wait their
turn, up to ``DEFAULT_POOL_TIMEOUT`` seconds."""
DEFAULT_POOL_TIMEOUT = 5.0


class UsageRetention(NamedTuple):
    """How many hourly and daily usage buckets are kept (default 7 days, 90 days)."""

    hours: int = 7 * 24
    days: int = 90

    def buckets(self, granularity: Granularity) -> int:
        return self.hours if granularity == "hour" else self.days

    def check(self) -> UsageRetention:
        for name, value in zip(("hours", "days"), self, strict=True):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                msg = f"usage retention {name} must be a positive integer, got {value!r}"
                raise ConfigError(msg)
        return self


def bucket_range(
    granularity: Granularity, start: float, end: float, now: float, retention: UsageRetention,
) -> range:
    """The bucket numbers to report: those overlapping [start, end], within retention."""
    if granularity not in BUCKET_SECONDS:
        msg = f"granularity must be 'hour' or 'day', got {granularity!r}"
        raise ConfigError(msg)
    size = BUCKET_SECONDS[granularity]
    oldest = int(now // size) - retention.buckets(granularity) + 1
    first = max(int(start // size), oldest)
    last = min(int(end // size), int(now // size))
    return range(first, last + 1)


class Storage(ABC):
    """Decides hits atomically: a request is admitted only when every hit admits it,
    and a denied request consumes nothing from any of them.

    ``key`` is the identity the limits count for (a client IP, an API key, a user);
    every hit of one call is stored under that identity, which on Redis means one
    hash slot, so the same call works on Redis Cluster.

    Beyond the abstract methods, a storage may offer fast paths, each with a default
    that any storage can rely on: ``decide_now`` (a verdict without awaiting),
    ``decide_within`` (a timeout kept more cheaply than a timer per call) and
    ``release_now`` (slots given back without awaiting). A subclass that overrides
    ``decide`` or ``release`` but not their fast paths gets the defaults back, so its
    override is what runs.
    """

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        for method, fast_paths in _FAST_PATHS.items():
            if method in cls.__dict__:
                for fast in fast_paths:
                    default = getattr(Storage, fast)
                    if fast not in cls.__dict__ and getattr(cls, fast) is not default:
                        setattr(cls, fast, default)

    @abstractmethod
    async def decide(self, key: str, hits: Sequence[Hit], *, usage: int = 0) -> Verdict:
        """Consume every hit's cost if all of them admit the request; else nothing.

        Concurrency hits take a slot each, returned as ``Verdict.leases``; with
        ``usage`` (a number of units, the request's cost; ``True`` is one), an admitted
        request also adds that many to the hourly and daily usage history, in the same
        atomic call.
        """

    def decide_now(self, key: str, hits: Sequence[Hit], usage: int = 0) -> Verdict | None:
        """The verdict of ``decide``, given without awaiting by a storage that can (one
        in this process); None, the default, to await ``decide``. The middleware passes
        ``usage`` by position: a keyword costs a parse per request."""
        return None

    async def decide_within(
        self, timeout: float, key: str, hits: Sequence[Hit], *, usage: int = 0,
    ) -> Verdict:
        """``decide``, given up after ``timeout`` seconds (``TimeoutError``, or a
        ``StorageError``). The default arms a timer per call; a storage that bounds
        its calls more cheaply overrides it."""
        async with asyncio.timeout(timeout):
            return await self.decide(key, hits, usage=usage)

    async def peek(self, key: str, hits: Sequence[Hit]) -> Verdict:
        """Look at the limits without consuming anything (for quota reports)."""
        return await self.decide(key, [Hit(hit.limit, 0, hit.scope) for hit in hits])

    async def renew(self, leases: Sequence[Lease], period_us: int) -> None:
        """Extend slots still held to a whole lease (``period_us``) from now, for a
        request that runs longer than its lease; an ended lease stays ended. A storage
        that does not override this keeps every lease as it was granted."""
        return None

    @abstractmethod
    async def release(self, leases: Sequence[Lease]) -> None:
        """Give concurrency slots back (at the end of the request that took them)."""

    def release_now(
        self, leases: Sequence[Lease],
        on_failure: Callable[[Sequence[Lease], BaseException], None],
    ) -> bool:
        """Give ``leases`` back without awaiting, if this storage can: True when they are
        back, or on their way ahead of any later decision of this storage (a failure
        that comes later goes to ``on_failure(leases, error)``); False, the default, to
        await ``release``."""
        return False

    settles: ClassVar[bool] = False
    """True when this storage settles charges after the response (``settle``); a
    limit that settles (``count=``, ``cost=``) needs one."""

    async def settle(self, adjustments: Sequence[Adjustment]) -> None:
        """Move each adjustment's counter by its delta, as if its request had been
        charged that much more (or less) when it was decided; every adjustment of the
        call in one atomic step. The default has no counters to move."""
        msg = f"{type(self).__name__} can't settle charges after the response"
        raise StorageError(msg)

    def settle_now(
        self, adjustments: Sequence[Adjustment],
        on_failure: Callable[[Sequence[Hold], BaseException], None],
    ) -> bool:
        """``settle`` without awaiting, where this storage can (see ``release_now``);
        False, the default, to await ``settle``."""
        return False

    async def close_holds(self, holds: Sequence[Hold]) -> None:
        """End what requests held after their decision, each hold once: a lease gives its
        slot back, an adjustment settles a reserved charge. The default hands each kind
        to its own method (``release``, ``settle``); a storage may close a mixed batch in
        one call instead. Before awaiting it, the middleware tries each kind's no-await
        method (``release_now``, ``settle_now``)."""
        leases = [hold for hold in holds if isinstance(hold, Lease)]
        adjustments = [hold for hold in holds if isinstance(hold, Adjustment)]
        if leases:
            await self.release(leases)
        if adjustments:
            await self.settle(adjustments)

    @abstractmethod
    async def usage(
        self, key: str, granularity: Granularity, start: float, end: float,
        unit: str = "requests",
    ) -> list[tuple[int, int]]:
        """Admitted requests per hour or day bucket: ``(bucket start, count)`` pairs, in
        epoch seconds, for the buckets overlapping ``[start, end]`` that are retained.
        With ``unit`` (``"tokens"``): what the admitted requests spent of it, settled
        charges included."""

    @abstractmethod
    async def reset(self, key: str) -> None:
        """Forget every counter of ``key``."""

    async def ping(self) -> bool:
        """True when the storage answers."""
        return True

    shared: ClassVar[bool] = True
    """True when every process on the same storage counts on the same counters; False
    for a storage of one process (several workers on it each count on their own)."""

    async def prepare(self) -> None:  # noqa: B027 - optional hook
        """Get ready to decide (connect, learn the topology, load scripts, open
        connections) before the first request: called once at start-up, under the
        caller's timeout. Raises what stopped it (the default has nothing to do)."""

    async def close(self) -> None:  # noqa: B027 - optional hook
        """Release connections; the storage is not used afterwards."""

    async def __aenter__(self) -> Storage:
        return self

    async def __aexit__(self, *exc_info: Any) -> None:
        await self.close()


def bad_usage(units: object) -> ConfigError:
    """The error for a ``usage`` outside 0 to ``MAX_AMOUNT`` units, named."""
    return ConfigError(f"usage must be a whole number of units from 0 to {MAX_AMOUNT:_}, "
                       f"got {units!r}")


_FAST_PATHS = {"decide": ("decide_now", "decide_within"), "release": ("release_now",),
               "settle": ("settle_now",)}
"""The fast paths of each method, which must answer as the method itself would."""

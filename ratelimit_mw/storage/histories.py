"""The memory storage's usage histories: per identity, the units admitted per hour and
per day."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

from ..hits import Hit, spends
from .base import BUCKET_SECONDS, Granularity, UsageRetention

__all__ = ["Histories"]

_HOUR_US: Final = 3_600_000_000
_DAY_US: Final = 86_400_000_000

Buckets = dict[int | str, int]
"""An identity's usage per hour or per day: requests under the bucket's number, other
units (tokens) under ``unit:number``."""


class Histories:
    """Each identity's hour and day buckets, kept beside its counters, not in them: the
    buckets are dicts changed in place, and a tuple holding a dict stays tracked by the
    garbage collector, so an entry holding them would be traversed by every collection
    after each request."""

    __slots__ = ("_by_key", "_days", "_hours", "_kept_us", "retention")

    def __init__(self, retention: UsageRetention) -> None:
        self.retention = retention
        # The retention's numbers as plain ints, and as microseconds: read per request,
        # where a named tuple's fields are a look-up each (and, compiled, a product this
        # large is multiplied as a Python int).
        self._hours: int = retention.hours
        self._days: int = retention.days
        self._kept_us: tuple[int, int] = (retention.hours * _HOUR_US, retention.days * _DAY_US)
        self._by_key: dict[str, tuple[Buckets, Buckets]] = {}

    def __len__(self) -> int:
        return len(self._by_key)

    def count(self, key: str, now: int, units: int, hits: Sequence[Hit]) -> int:
        """Add an admitted request's ``units`` to the hour and day buckets of ``now``,
        and what its hits spend of other units (tokens) to theirs; until when the
        history is kept (a whole microsecond)."""
        history = self._by_key.get(key)
        if history is None:
            history = self._by_key[key] = ({}, {})
        hours, days = history
        hour, day = now // _HOUR_US, now // _DAY_US
        # Each bucket's number boxed once, for its look-up and its store.
        hour_key: Any = hour
        day_key: Any = day
        hours[hour_key] = hours.get(hour_key, 0) + units
        days[day_key] = days.get(day_key, 0) + units
        for unit, spent in spends(hits):
            hourly, daily = f"{unit}:{hour}", f"{unit}:{day}"
            hours[hourly] = hours.get(hourly, 0) + spent
            days[daily] = days.get(daily, 0) + spent
        kept_hours, kept_days = self._hours, self._days
        _forget_before(hours, hour - kept_hours, kept_hours)
        _forget_before(days, day - kept_days, kept_days)
        # The hourly buckets' retention may be the longer one.
        hours_us, days_us = self._kept_us
        return max(now - now % _DAY_US + days_us, now - now % _HOUR_US + hours_us)

    def settle(self, key: str, unit: str, at: int, delta: int) -> None:
        """Move the ``unit`` buckets of the hour and day of ``at`` (µs) by ``delta``
        (never below 0), where the history counted them."""
        history = self._by_key.get(key)
        if history is None:
            return
        for counts, bucket in ((history[0], at // _HOUR_US), (history[1], at // _DAY_US)):
            name = f"{unit}:{bucket}"
            if name in counts:
                counts[name] = max(0, counts[name] + delta)

    def read(self, key: str, granularity: Granularity, buckets: range,
             unit: str) -> list[tuple[int, int]]:
        """``(start, count)`` of each of ``buckets`` (numbers) of ``key``'s history."""
        history = self._by_key.get(key)
        counts = {} if history is None else history[0 if granularity == "hour" else 1]
        size = BUCKET_SECONDS[granularity]
        if unit == "requests":
            return [(n * size, counts.get(n, 0)) for n in buckets]
        return [(n * size, counts.get(f"{unit}:{n}", 0)) for n in buckets]

    def forget(self, key: str) -> None:
        self._by_key.pop(key, None)

    def clear(self) -> None:
        self._by_key.clear()


def _forget_before(counts: Buckets, oldest: int, kept: int) -> None:
    """Drop the buckets numbered ``oldest`` or lower, once there are more than ``kept``
    (requests' buckets are numbers, other units' ``unit:number``)."""
    if len(counts) > kept:
        for bucket in [b for b in counts if _number(b) <= oldest]:
            del counts[bucket]


def _number(bucket: int | str) -> int:
    return bucket if isinstance(bucket, int) else int(bucket.rpartition(":")[2])

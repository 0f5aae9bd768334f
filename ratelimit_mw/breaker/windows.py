"""Sliding windows of call outcomes: the last N calls, or the calls of the last N seconds."""

from __future__ import annotations

import math
from collections import deque

__all__ = ["CountWindow", "TimeWindow"]


class CountWindow:
    """Outcomes of the last ``size`` calls."""

    __slots__ = ("_failures", "_outcomes", "_size", "_slow")

    def __init__(self, size: int) -> None:
        self._outcomes: deque[tuple[bool, bool]] = deque(maxlen=size)
        self._size = size
        self._failures = 0
        self._slow = 0

    def record(self, now: float, failed: bool, slow: bool) -> None:
        """Add one outcome, dropping the oldest when the window is full."""
        if not (failed or slow or self._failures or self._slow) and (
                len(self._outcomes) == self._size):
            return  # all successes, full: one more in, one out leaves it as it is
        if len(self._outcomes) == self._size:
            old_failed, old_slow = self._outcomes[0]
            self._failures -= old_failed
            self._slow -= old_slow
        self._outcomes.append((failed, slow))
        self._failures += failed
        self._slow += slow

    def totals(self, now: float) -> tuple[int, int, int]:
        """Calls, failures and slow calls in the window."""
        return len(self._outcomes), self._failures, self._slow

    def clean(self) -> bool:
        """True when the window holds no failure and no slow call (no rate to compute)."""
        return not (self._failures or self._slow)


class TimeWindow:
    """Outcomes of the calls ended in the last ``size`` seconds, in one-second buckets."""

    __slots__ = ("_buckets", "_calls", "_failures", "_size", "_slow")

    def __init__(self, size: int) -> None:
        self._size = size
        self._buckets: deque[list[int]] = deque()  # [second, calls, failures, slow]
        self._calls = self._failures = self._slow = 0

    def _evict(self, now: float) -> None:
        """Forget the buckets that have left the window."""
        oldest = math.floor(now) - self._size + 1
        while self._buckets and self._buckets[0][0] < oldest:
            _, calls, failures, slow = self._buckets.popleft()
            self._calls -= calls
            self._failures -= failures
            self._slow -= slow

    def record(self, now: float, failed: bool, slow: bool) -> None:
        """Add one outcome to the bucket of the current second."""
        self._evict(now)
        second = math.floor(now)
        if not self._buckets or self._buckets[-1][0] < second:
            self._buckets.append([second, 0, 0, 0])
        bucket = self._buckets[-1]
        bucket[1] += 1
        bucket[2] += failed
        bucket[3] += slow
        self._calls += 1
        self._failures += failed
        self._slow += slow

    def totals(self, now: float) -> tuple[int, int, int]:
        """Calls, failures and slow calls in the window."""
        self._evict(now)
        return self._calls, self._failures, self._slow

    def clean(self) -> bool:
        """True when the window holds no failure and no slow call (buckets not yet
        evicted included: it may say False too often, never True too often)."""
        return not (self._failures or self._slow)

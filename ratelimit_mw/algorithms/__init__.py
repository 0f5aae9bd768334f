"""The algorithms, each a pure function of (state, now, amount, period, capacity, cost).

No I/O and no clock reads: storages read the clock (or Redis's) and keep the state.
Each module has a Lua twin of the same stem in ``ratelimit_mw/storage/lua``.
``ALGORITHMS`` is the one registry: every name, alias, capability and line of the docs'
table comes from it (``docs/algorithms.md`` is checked against it); ``limits.run`` is
the one place a limit's step is dispatched to its module.
"""

from __future__ import annotations

from typing import Literal, NamedTuple

from .base import NEVER_US, RawStep, Step

__all__ = [
    "ALGORITHMS", "ALIASES", "NEVER_US", "RATE_ALGORITHMS", "Algorithm", "AlgorithmName",
    "RawStep", "Step",
]

AlgorithmName = Literal[
    "fixed_window", "sliding_log", "sliding_window", "token_bucket", "gcra", "concurrency",
    "calendar_month"]


class Algorithm(NamedTuple):
    """One algorithm as the registry knows it."""

    name: AlgorithmName
    state: str
    """What it keeps per key and limit (the docs' table)."""
    use: str
    """When to pick it (the docs' table)."""
    rate: bool = True
    """A rate algorithm, written ``Limit("10/minute", name)``; the others have their own
    constructors (``Limit.concurrency``, ``Limit.monthly``)."""
    burst: bool = False
    """Takes ``burst=``: how many may arrive at once, beside the sustained rate."""


ALGORITHMS: dict[AlgorithmName, Algorithm] = {algorithm.name: algorithm for algorithm in (
    Algorithm("fixed_window", "one counter",
              "cheapest; tolerates up to 2x the limit across a window edge; a daily quota "
              "that resets at 00:00 UTC"),
    Algorithm("sliding_log", "one timestamp per admitted unit",
              "exactness matters and limits are small (memory O(limit))"),
    Algorithm("sliding_window", "two counters",
              "the usual API default: smooth and O(1); its reset is when the whole count is "
              "gone, up to two windows away, while `Retry-After` is when the next request "
              "passes"),
    Algorithm("token_bucket", "tokens + last refill",
              "bursts (`burst=`) on top of a sustained rate", burst=True),
    Algorithm("gcra", "one timestamp",
              "like the token bucket in O(1), integer arithmetic (redis-cell's algorithm)",
              burst=True),
    Algorithm("calendar_month", "one counter",
              "monthly quotas that reset on the 1st (UTC), as billing periods do", rate=False),
    Algorithm("concurrency", "one lease per request in flight",
              "capping slow or expensive requests in flight, whatever their rate",
              rate=False),
)}
"""Every algorithm, in the order the docs list them."""

ALIASES: dict[str, AlgorithmName] = {
    "fixed": "fixed_window",
    "moving_window": "sliding_log",
    "sliding_window_counter": "sliding_window",
    "leaky_bucket": "gcra",
}
"""Other names users know them by (limits', nginx's), accepted wherever one is named."""

RATE_ALGORITHMS: tuple[AlgorithmName, ...] = tuple(
    name for name, algorithm in ALGORITHMS.items() if algorithm.rate)
"""The rate algorithms (``fixed_window`` to ``gcra``)."""

"""What every algorithm returns, and the integer helpers they share.

Algorithms count time in whole microseconds, so that a wait of exactly
``retry_us`` is exact, and so that each Lua twin computes the same numbers.
"""

from __future__ import annotations

from typing import Any, Final, NamedTuple

__all__ = ["NEVER_US", "RawStep", "Step", "ceil_div"]

NEVER_US: Final = -1
"""``retry_us`` of a cost that the limit can never admit."""


class Step(NamedTuple):
    """One algorithm's answer: the decision, and the state to store if it is committed.

    The algorithms return plain tuples of these five fields (the hot path builds no
    named tuple); ``algorithms.decide`` wraps them in a ``Step`` for readers and tests.
    """

    allowed: bool
    remaining: int
    reset_us: int
    retry_us: int
    state: Any


RawStep = tuple[bool, int, int, int, Any]
"""``(allowed, remaining, reset_us, retry_us, state)``: a ``Step`` as a plain tuple."""


def ceil_div(a: int, b: int) -> int:
    """Integer ceiling of ``a / b`` for ``b > 0``."""
    return -(-a // b)

"""Capped exponential backoff with full jitter, as a pure function."""

from __future__ import annotations

import math
import random as _random
from collections.abc import Callable

__all__ = ["full_jitter"]


def full_jitter(
    attempt: int,
    *,
    base: float,
    cap: float,
    random: Callable[[], float] = _random.random,
) -> float:
    """Return ``uniform(0, min(cap, base * 2**attempt))``, the cap applied before the draw.

    ``attempt`` counts retries from 0. ``random`` returns a float in ``[0, 1)``;
    pass a fixed one to make the result deterministic. Huge attempts do not
    overflow: once ``base * 2**attempt`` would pass ``cap``, ``cap`` is used.
    """
    if attempt < 0:
        msg = f"attempt must be >= 0, got {attempt}"
        raise ValueError(msg)
    # Compare exponents rather than computing 2**attempt, which overflows floats.
    if base <= 0 or cap <= 0:
        ceiling = 0.0
    elif attempt >= math.log2(cap) - math.log2(base):
        ceiling = cap
    else:
        ceiling = min(cap, math.ldexp(base, attempt))
    return ceiling * random()

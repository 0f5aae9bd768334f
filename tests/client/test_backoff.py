"""Capped exponential backoff with full jitter."""

from __future__ import annotations

import random
import statistics

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ratelimit_mw.client import full_jitter


@pytest.mark.parametrize(
    ("attempt", "ceiling"), [(0, 0.5), (1, 1.0), (2, 2.0), (5, 16.0), (6, 30.0), (60, 30.0)]
)
def test_ceiling_doubles_until_the_cap(attempt: int, ceiling: float) -> None:
    """The upper bound is min(cap, base * 2**attempt)."""
    assert full_jitter(attempt, base=0.5, cap=30.0, random=lambda: 1.0) == ceiling


def test_cap_applies_before_the_draw() -> None:
    """The draw is scaled to the capped ceiling, so half the draw is half the cap."""
    assert full_jitter(10, base=1.0, cap=8.0, random=lambda: 0.5) == 4.0


def test_zero_draw_is_zero_wait() -> None:
    """Full jitter starts at 0."""
    assert full_jitter(3, base=1.0, cap=8.0, random=lambda: 0.0) == 0.0


@pytest.mark.parametrize("attempt", [1_024, 1_100, 10_000, 10**9])
def test_no_overflow_at_huge_attempts(attempt: int) -> None:
    """Huge attempt numbers give the cap instead of an OverflowError."""
    assert full_jitter(attempt, base=0.5, cap=30.0, random=lambda: 1.0) == 30.0


def test_no_overflow_with_a_tiny_base() -> None:
    """A tiny base needs many doublings; 2**1025 must not be computed as a float."""
    wait = full_jitter(1025, base=1e-300, cap=1e10, random=lambda: 1.0)
    assert 0 < wait < 1e10


def test_negative_attempt_is_rejected() -> None:
    """Attempts count from 0."""
    with pytest.raises(ValueError, match="attempt must be >= 0"):
        full_jitter(-1, base=0.5, cap=30.0)


def test_draws_are_uniform_below_the_ceiling() -> None:
    """Many draws at one attempt spread uniformly over [0, ceiling)."""
    rng = random.Random(20260501)
    draws = [full_jitter(3, base=1.0, cap=100.0, random=rng.random) for _ in range(4000)]
    assert all(0 <= d < 8.0 for d in draws)
    assert statistics.fmean(draws) == pytest.approx(4.0, abs=0.2)
    # Each quarter of the range gets about a quarter of the draws.
    quarters = [sum(1 for d in draws if q * 2 <= d < (q + 1) * 2) for q in range(4)]
    assert all(850 < count < 1150 for count in quarters)


@given(
    st.integers(min_value=0, max_value=10**6),
    st.floats(min_value=0, max_value=1e6),
    st.floats(min_value=0, max_value=1e6),
    st.floats(min_value=0, max_value=1, exclude_max=True),
)
def test_always_between_zero_and_cap(attempt: int, base: float, cap: float, draw: float) -> None:
    """Whatever the inputs, the wait lies in [0, cap]."""
    wait = full_jitter(attempt, base=base, cap=cap, random=lambda: draw)
    assert 0 <= wait <= cap


@pytest.mark.parametrize(
    ("base", "cap"), [(2.0, 5e-324), (5e-324, 1.7e308), (1e308, 1.0), (0.0, 1.0), (1.0, 0.0)]
)
@pytest.mark.parametrize("attempt", [0, 3, 10**9])
def test_extreme_floats(base: float, cap: float, attempt: int) -> None:
    """Subnormal and huge settings neither raise nor leave [0, cap]."""
    assert 0 <= full_jitter(attempt, base=base, cap=cap, random=lambda: 0.999) <= cap

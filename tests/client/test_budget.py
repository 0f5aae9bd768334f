"""The gRPC-style retry budget shared across calls."""

from __future__ import annotations

import pytest

from ratelimit_mw.client import RetryBudget


def test_fresh_budget_allows_retries() -> None:
    """A full budget allows retrying."""
    assert RetryBudget().can_retry()


def test_retries_stop_at_half() -> None:
    """Each failure costs one token; at half the tokens retries stop."""
    budget = RetryBudget(max_tokens=10, token_ratio=0.1)
    for _ in range(4):
        budget.record_failure()
    assert budget.tokens == 6
    assert budget.can_retry()
    budget.record_failure()
    assert budget.tokens == 5
    assert not budget.can_retry()


def test_successes_earn_a_tenth() -> None:
    """A success earns token_ratio tokens, so ten successes pay for one failure."""
    budget = RetryBudget(max_tokens=10, token_ratio=0.1)
    for _ in range(5):
        budget.record_failure()
    budget.record_success()
    assert budget.tokens == pytest.approx(5.1)
    assert budget.can_retry()


def test_tokens_stay_between_zero_and_max() -> None:
    """Tokens never go below 0 nor above max_tokens."""
    budget = RetryBudget(max_tokens=2, token_ratio=1)
    for _ in range(5):
        budget.record_failure()
    assert budget.tokens == 0
    for _ in range(5):
        budget.record_success()
    assert budget.tokens == 2


@pytest.mark.parametrize(
    ("max_tokens", "token_ratio"), [(0, 0.1), (-1, 0.1), (float("inf"), 0.1), (10, 0), (10, 11)]
)
def test_bad_settings_are_rejected(max_tokens: float, token_ratio: float) -> None:
    """Budgets that could never work are refused at construction."""
    with pytest.raises(ValueError, match="must be"):
        RetryBudget(max_tokens=max_tokens, token_ratio=token_ratio)


def test_repr_shows_tokens() -> None:
    """The repr shows the live token count."""
    budget = RetryBudget(max_tokens=4)
    budget.record_failure()
    assert repr(budget) == "RetryBudget(tokens=3/4, token_ratio=0.1)"

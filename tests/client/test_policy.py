"""Retry settings and their per-request overrides."""

from __future__ import annotations

import math

import httpx
import pytest

from ratelimit_mw.client import RETRY_METHODS, RETRY_STATUSES, RetryPolicy


def test_defaults_follow_the_issue() -> None:
    """Retryable statuses and replay-safe methods are the documented ones."""
    assert {408, 429, 500, 502, 503, 504} == RETRY_STATUSES
    assert {"GET", "HEAD", "OPTIONS", "PUT", "DELETE"} == RETRY_METHODS
    policy = RetryPolicy()
    assert policy.retry_statuses == RETRY_STATUSES
    assert policy.retry_methods == RETRY_METHODS


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("max_retries", -1),
        ("max_time", -1.0),
        ("max_time", math.inf),
        ("max_time", math.nan),
        ("backoff_base", -0.1),
        ("backoff_cap", math.inf),
        ("backoff_cap", math.nan),
        ("max_retries", 2.5),
        ("max_retries", math.inf),
        ("max_retries", "3"),
        ("max_retries", True),
        ("max_time", "60"),
        ("backoff_base", True),
        # A lone string would be iterated character by character; strings are no statuses.
        ("retry_statuses", "503"),
        ("retry_statuses", {"429", "503"}),
        ("retry_statuses", {-5, 999}),
        ("retry_statuses", {True}),
        ("retry_methods", "GET"),
        ("retry_methods", {"GET", 1}),
        ("hints", [1]),
    ],
)
def test_bad_values_are_rejected(field: str, value: object) -> None:
    """Nonsense settings fail at construction with the field's name (a wrong type too:
    it would otherwise turn retrying off without a word, or fail at the first retry)."""
    with pytest.raises(ValueError, match=field):
        RetryPolicy(**{field: value})  # type: ignore[arg-type]


def test_methods_are_normalised() -> None:
    """Methods may be given in any case and any iterable."""
    policy = RetryPolicy(retry_methods=["get", "Post"])  # type: ignore[arg-type]
    assert policy.retry_methods == frozenset({"GET", "POST"})


def test_request_without_override_uses_the_policy() -> None:
    """No retry extension means the transport's policy."""
    policy = RetryPolicy(max_retries=7)
    assert policy.for_request(httpx.Request("GET", "http://x")) is policy


def test_request_override_dict() -> None:
    """A dict in extensions['retry'] overrides some fields and keeps the rest."""
    policy = RetryPolicy(max_retries=7, max_time=5.0)
    request = httpx.Request("GET", "http://x", extensions={"retry": {"max_retries": 1}})
    assert policy.for_request(request) == RetryPolicy(max_retries=1, max_time=5.0)


def test_request_override_policy() -> None:
    """A RetryPolicy in extensions['retry'] replaces the transport's."""
    mine = RetryPolicy(max_retries=0)
    request = httpx.Request("GET", "http://x", extensions={"retry": mine})
    assert RetryPolicy().for_request(request) is mine


def test_unknown_override_names_the_known_ones() -> None:
    """A typo in an override fails loudly, listing the valid names."""
    request = httpx.Request("GET", "http://x", extensions={"retry": {"max_retry": 1}})
    with pytest.raises(TypeError, match=r"max_retry.*expected some of: max_retries"):
        RetryPolicy().for_request(request)


def test_override_of_the_wrong_type() -> None:
    """extensions['retry'] must be a dict or a RetryPolicy."""
    request = httpx.Request("GET", "http://x", extensions={"retry": 3})
    with pytest.raises(TypeError, match="got int"):
        RetryPolicy().for_request(request)

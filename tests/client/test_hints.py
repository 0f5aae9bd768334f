"""Provider quota headers: GitHub epoch resets, the IETF RateLimit drafts, custom durations."""

from __future__ import annotations

import logging
import math
import time

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st

from ratelimit_mw.client import (
    DEFAULT_HINTS,
    Quota,
    duration_hint,
    github_reset_hint,
    ratelimit_header_hint,
    read_quota,
)

from .conftest import WALL_NOW

EPOCH_IN_60 = str(int(WALL_NOW) + 60)


def headers(**values: str) -> httpx.Headers:
    """Build headers from keyword arguments, underscores as dashes."""
    return httpx.Headers({name.replace("_", "-"): value for name, value in values.items()})


def test_github_reset_is_epoch_seconds_when_exhausted() -> None:
    """GitHub's x-ratelimit-reset is an epoch time; the wait runs until then."""
    hint = github_reset_hint(
        headers(x_ratelimit_remaining="0", x_ratelimit_reset=EPOCH_IN_60), WALL_NOW
    )
    assert hint == 60.0


def test_github_reset_ignored_while_requests_remain() -> None:
    """A reset time is no reason to wait while the quota is not used up."""
    hint = github_reset_hint(
        headers(x_ratelimit_remaining="3", x_ratelimit_reset=EPOCH_IN_60), WALL_NOW
    )
    assert hint is None


def test_github_reset_in_the_past_means_zero() -> None:
    """An epoch reset already passed means retry now."""
    past = str(int(WALL_NOW) - 5)
    assert (
        github_reset_hint(headers(x_ratelimit_remaining="0", x_ratelimit_reset=past), WALL_NOW) == 0
    )


def test_duration_under_epoch_name_is_refused(caplog: pytest.LogCaptureFixture) -> None:
    """A small x-ratelimit-reset is a duration, not an epoch: refused and logged, never guessed."""
    with caplog.at_level(logging.WARNING, logger="ratelimit_mw.client"):
        hint = github_reset_hint(
            headers(x_ratelimit_remaining="0", x_ratelimit_reset="60"), WALL_NOW
        )
    assert hint is None
    assert "duration_hint" in caplog.text


@pytest.mark.parametrize(
    ("value", "wait"),
    [
        ('"burst";r=0;t=30', 30.0),
        ('"burst";r=5;t=30, "daily";r=0;t=3600', 3600.0),
        ('"a";r=0;t=10, "b";r=0;t=20', 20.0),
        ('"burst";t=30;r=0', 30.0),
        ('"with, comma";r=0;t=4', 4.0),
        ('"a=b; c";r=0;t=6', 6.0),
        ('"burst";r=0;t=30;pk=:cHJvamVjdDEyMw==:', 30.0),
        ("limit=5, remaining=0, reset=30", 30.0),
        ("remaining=0, reset=0", 0.0),
    ],
)
def test_ratelimit_field_when_exhausted(value: str, wait: float) -> None:
    """Draft-11 items and draft-7 dictionaries give the reset of the exhausted policy."""
    assert ratelimit_header_hint(headers(ratelimit=value), WALL_NOW) == wait


@pytest.mark.parametrize(
    "value", ['"burst";r=1;t=30', "limit=5, remaining=4, reset=30", '"burst";r=0']
)
def test_ratelimit_field_not_exhausted_or_no_reset(value: str) -> None:
    """Remaining quota, or no reset, is no hint."""
    assert ratelimit_header_hint(headers(ratelimit=value), WALL_NOW) is None


def test_draft6_reset_header() -> None:
    """Draft-6 RateLimit-Reset is a duration, used when nothing says requests remain."""
    assert ratelimit_header_hint(headers(ratelimit_reset="30"), WALL_NOW) == 30.0
    assert (
        ratelimit_header_hint(headers(ratelimit_reset="30", ratelimit_remaining="0"), WALL_NOW)
        == 30.0
    )
    assert (
        ratelimit_header_hint(headers(ratelimit_reset="30", ratelimit_remaining="2"), WALL_NOW)
        is None
    )


@pytest.mark.parametrize(
    "value",
    [
        '"burst";r=0;t=-1',
        '"burst";r=0;t=1.5',
        "garbage",
        ",,;;=",
        ";",
        ";,;",
        "=",
        '"unterminated',
        "",
        '"b";r=0;t=30' + "," * 5000,
    ],
)
def test_ratelimit_garbage_is_no_hint(value: str) -> None:
    """Bad RateLimit values give no hint."""
    assert ratelimit_header_hint(headers(ratelimit=value), WALL_NOW) is None


def test_read_quota_prefers_ietf_then_github() -> None:
    """read_quota reads whichever style the server speaks."""
    assert read_quota(headers(ratelimit='"q";r=4;t=9'), WALL_NOW) == Quota(4, 9.0)
    assert read_quota(
        headers(x_ratelimit_remaining="7", x_ratelimit_reset=EPOCH_IN_60), WALL_NOW
    ) == Quota(7, 60.0)
    assert read_quota(headers(), WALL_NOW) is None


def test_duration_hint_for_other_providers() -> None:
    """duration_hint reads a provider's seconds-until-reset header as a duration."""
    hint = duration_hint("x-ratelimit-reset-after")
    assert hint(headers(x_ratelimit_reset_after="7"), WALL_NOW) == 7.0
    assert hint(headers(x_ratelimit_reset_after="7.5"), WALL_NOW) is None
    assert hint(headers(), WALL_NOW) is None


def test_duration_hint_with_remaining_header() -> None:
    """With remaining_header, the duration counts only once the quota is used up."""
    hint = duration_hint("x-ratelimit-reset", remaining_header="x-ratelimit-remaining")
    assert hint(headers(x_ratelimit_reset="7", x_ratelimit_remaining="1"), WALL_NOW) is None
    assert hint(headers(x_ratelimit_reset="7", x_ratelimit_remaining="0"), WALL_NOW) == 7.0


header_names = st.sampled_from(
    [
        "retry-after",
        "ratelimit",
        "ratelimit-reset",
        "ratelimit-remaining",
        "x-ratelimit-reset",
        "x-ratelimit-remaining",
    ]
)
header_values = (
    st.text(alphabet=st.characters(min_codepoint=32, max_codepoint=126), max_size=40)
    | st.text(alphabet='";,=\\ \trt0129-.', max_size=30)
    | st.sampled_from(['"b";r=0;t=', "remaining=0, reset=", "0", "99999999999"])
)


@given(st.dictionaries(header_names, header_values, max_size=6))
def test_hint_parsers_never_raise(values: dict[str, str]) -> None:
    """Every default hint parser survives any header values and answers None or a wait >= 0."""
    for parse in DEFAULT_HINTS:
        wait = parse(httpx.Headers(values), WALL_NOW)
        assert wait is None or (math.isfinite(wait) and wait >= 0)
    quota = read_quota(httpx.Headers(values), WALL_NOW)
    assert quota is None or quota.remaining is None or quota.remaining >= 0


@pytest.mark.parametrize(
    "value", ['a\\"' * 30_000, '"' * 100_000, '"' + "\\" * 100_000, ',"' * 50_000]
)
def test_hostile_long_fields_are_cheap(value: str) -> None:
    """Megabyte-scale quoted garbage is refused quickly: no quadratic splitting."""
    started = time.perf_counter()
    for parse in DEFAULT_HINTS:
        assert parse(httpx.Headers({"ratelimit": value, "retry-after": value}), WALL_NOW) is None
    assert time.perf_counter() - started < 1.0

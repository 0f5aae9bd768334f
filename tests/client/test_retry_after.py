"""Retry-After parsing: delay-seconds, the three HTTP-date forms, and garbage."""

from __future__ import annotations

import calendar
import logging
import math
import time
from collections.abc import Iterator
from datetime import UTC, datetime

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st

from ratelimit_mw.client import parse_retry_after, retry_after_hint

from .conftest import WALL_NOW

# WALL_NOW + 30 s, in the three forms RFC 9110 allows.
IN_30_SECONDS = [
    "Fri, 01 May 2026 12:00:30 GMT",  # IMF-fixdate
    "Friday, 01-May-26 12:00:30 GMT",  # RFC 850
    "Fri May  1 12:00:30 2026",  # asctime
]

GARBAGE = [
    "",
    " ",
    "-1",
    "+1",
    "1.0",
    "1e3",
    "0x10",
    "1_000",
    "inf",
    "-inf",
    "NaN",
    "1m0s",
    "30s",
    "٣",  # an Arabic-Indic digit: int() takes it, HTTP does not
    "1, 2",
    "9" * 5000,
    "9" * 11,
    "Fri, 01 May 99999 12:00:30 GMT",
    "Fri, 01 May 0000 12:00:30 GMT",
    "Fri, 31 Feb 2026 12:00:30 GMT",
    "Fri, 01 May 2026 24:00:00 GMT",
    "Fri, 01 May 2026 12:60:00 GMT",
    "Fri, 01 May 2026 12:00:30 UTC",
    "Fri, 01 May 2026 12:00:30 +0000",
    "fri, 01 may 2026 12:00:30 gmt",
    "Fri, 1 May 2026 12:00:30 GMT",
    "2026-05-01T12:00:30Z",
    "Friday, 01-May-2026 12:00:30 GMT",
    "Fri May 1 12:00:30 2026",
    "Fri, 01 May 2026 12:00:30 GMT trailing",
]


@pytest.fixture(params=["UTC", "America/New_York", "Asia/Kolkata", "Pacific/Chatham", "EST+05"])
def local_timezone(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> Iterator[str]:
    """Run the test with the process in another local time zone."""
    monkeypatch.setenv("TZ", request.param)
    time.tzset()
    yield request.param
    monkeypatch.undo()
    time.tzset()


@pytest.mark.parametrize(
    ("value", "seconds"),
    [("120", 120.0), ("\t42 ", 42.0), ("0", 0.0), ("007", 7.0), ("9999999999", 9999999999.0)],
)
def test_delay_seconds(value: str, seconds: float) -> None:
    """Digits, with optional spaces and tabs around them, are a delay in seconds."""
    assert parse_retry_after(value, now=WALL_NOW) == seconds


@pytest.mark.parametrize("value", IN_30_SECONDS)
def test_http_date_forms(value: str, local_timezone: str) -> None:
    """All three HTTP-date forms read as GMT whatever the local time zone."""
    assert parse_retry_after(value, now=WALL_NOW) == 30.0


@pytest.mark.parametrize("value", IN_30_SECONDS)
def test_http_date_with_surrounding_whitespace(value: str) -> None:
    """Optional whitespace around a date is allowed."""
    assert parse_retry_after(f" {value}\t", now=WALL_NOW) == 30.0


def test_http_date_fraction_of_a_second_ahead() -> None:
    """The wait is measured from the exact current time, not a rounded one."""
    assert parse_retry_after(IN_30_SECONDS[0], now=WALL_NOW + 0.25) == pytest.approx(29.75)


@pytest.mark.parametrize(
    "value",
    [
        "Fri, 01 May 2026 11:59:59 GMT",
        "Sun, 06 Nov 1994 08:49:37 GMT",
        "Sunday, 06-Nov-94 08:49:37 GMT",
    ],
)
def test_past_date_means_zero(value: str) -> None:
    """A date in the past means retry now."""
    assert parse_retry_after(value, now=WALL_NOW) == 0.0


def test_rfc850_year_more_than_50_years_ahead_is_last_century() -> None:
    """A two-digit year 70 years ahead is read as the same year last century (RFC 9110 5.6.7)."""
    # 2096 would be 70 years ahead of 2026, so -96 means 1996: in the past.
    assert parse_retry_after("Friday, 01-May-96 12:00:30 GMT", now=WALL_NOW) == 0.0
    # 2030 is within 50 years: 4 years ahead.
    in_2030 = calendar.timegm((2030, 5, 1, 12, 0, 0, 0, 0, 0)) - WALL_NOW
    assert parse_retry_after("Wednesday, 01-May-30 12:00:00 GMT", now=WALL_NOW) == in_2030


@pytest.mark.parametrize("value", GARBAGE)
def test_garbage_is_none(value: str) -> None:
    """Garbage gives None instead of raising, so the caller falls back to backoff."""
    assert parse_retry_after(value, now=WALL_NOW) is None


@pytest.mark.parametrize("value", ["-1", "inf", "9" * 5000])
def test_garbage_hint_is_logged(value: str, caplog: pytest.LogCaptureFixture) -> None:
    """The hint parser logs the value it ignores, shortened."""
    with caplog.at_level(logging.WARNING, logger="ratelimit_mw.client"):
        assert retry_after_hint(httpx.Headers({"Retry-After": value}), WALL_NOW) is None
    (record,) = caplog.records
    assert "Retry-After" in record.getMessage()
    assert len(record.getMessage()) < 300


@pytest.mark.parametrize(("lines", "wait"), [
    (["3", "3"], 3.0),
    (["3", "5"], 5.0),
    (["5, 7"], 7.0),
    (["soon", "4"], 4.0),
    (["4, soon"], 4.0),
    (["Thu, 01 Jan 1970 00:01:00 GMT, Thu, 01 Jan 1970 00:02:00 GMT"], 120.0 - 30.0),
    (["Thu, 01 Jan 1970 00:01:00 GMT", "100"], 100.0),
])
def test_repeated_or_joined_values_ask_for_the_longest(lines: list[str], wait: float) -> None:
    """Several values (repeated lines, or joined by a proxy): each is a minimum wait,
    so the longest valid one counts."""
    now = 30.0 if "1970" in lines[0] else WALL_NOW
    headers = httpx.Headers([("Retry-After", line) for line in lines])
    assert retry_after_hint(headers, now) == wait


def test_many_joined_values_are_cheap() -> None:
    """A hostile line of a million commas is garbage, read in no time."""
    assert retry_after_hint(httpx.Headers({"Retry-After": "," * 1_000_000}), WALL_NOW) is None


def test_missing_header_is_no_hint(caplog: pytest.LogCaptureFixture) -> None:
    """No Retry-After header is no hint and nothing to log."""
    with caplog.at_level(logging.DEBUG, logger="ratelimit_mw.client"):
        assert retry_after_hint(httpx.Headers(), WALL_NOW) is None
    assert caplog.records == []


@pytest.mark.slow
@given(st.text(max_size=60))
def test_never_raises_on_any_text(value: str) -> None:
    """Any text gives None or a finite, non-negative wait."""
    wait = parse_retry_after(value, now=WALL_NOW)
    assert wait is None or (math.isfinite(wait) and wait >= 0)


@given(st.datetimes(min_value=datetime(1000, 1, 1)))
def test_imf_fixdate_round_trip(moment: datetime) -> None:
    """Any formatted IMF-fixdate from year 1000 on parses back to its own time."""
    moment = moment.replace(microsecond=0, tzinfo=UTC)
    value = moment.strftime("%a, %d %b %Y %H:%M:%S GMT")
    expected = max(0.0, moment.timestamp() - WALL_NOW)
    assert parse_retry_after(value, now=WALL_NOW) == expected

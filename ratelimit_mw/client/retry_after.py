"""RFC 9110 ``Retry-After`` parsing: delay-seconds or an HTTP-date, never raising."""

from __future__ import annotations

import calendar
import re
import time

__all__ = ["parse_delay_seconds", "parse_http_date", "parse_retry_after"]

# Ten digits is about 317 years; anything longer is noise, and int() of a
# 5000-digit string would raise on Python 3.11+ (int_max_str_digits).
_DELAY_SECONDS = re.compile(r"[0-9]{1,10}", re.ASCII)
# Optional whitespace per RFC 9110 is SP and HTAB only.
_OWS = " \t"

_MONTHS = {
    name: number
    for number, name in enumerate(
        ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"),
        start=1,
    )
}
_MONTH = "(?P<month>Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec)"
_TIME = r"(?P<hour>[0-9]{2}):(?P<minute>[0-9]{2}):(?P<second>[0-9]{2})"
_IMF_FIXDATE = re.compile(
    rf"(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun), (?P<day>[0-9]{{2}}) {_MONTH} (?P<year>[0-9]{{4}}) "
    rf"{_TIME} GMT",
    re.ASCII,
)
_RFC850 = re.compile(
    rf"(?:Monday|Tuesday|Wednesday|Thursday|Friday|Saturday|Sunday), "
    rf"(?P<day>[0-9]{{2}})-{_MONTH}-(?P<year>[0-9]{{2}}) {_TIME} GMT",
    re.ASCII,
)
_ASCTIME = re.compile(
    rf"(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun) {_MONTH} (?P<day>[ 0-9][0-9]) {_TIME} (?P<year>[0-9]{{4}})",
    re.ASCII,
)


def parse_delay_seconds(value: str) -> int | None:
    """Return the non-negative integer in ``value`` (digits only, OWS around), else None."""
    stripped = value.strip(_OWS)
    if _DELAY_SECONDS.fullmatch(stripped) is None:
        return None
    return int(stripped)


def parse_http_date(value: str, *, now: float) -> float | None:
    """Return the Unix time of an HTTP-date in any of its three forms, else None.

    ``now`` (Unix seconds) resolves the two-digit year of the RFC 850 form:
    a date more than 50 years ahead means the previous century (RFC 9110 5.6.7).
    """
    stripped = value.strip(_OWS)
    for pattern in (_IMF_FIXDATE, _RFC850, _ASCTIME):
        match = pattern.fullmatch(stripped)
        if match is not None:
            break
    else:
        return None
    year = int(match["year"])
    if pattern is _RFC850:
        this_year = time.gmtime(now).tm_year
        year += this_year - this_year % 100
        if year > this_year + 50:
            year -= 100
    day, hour, minute, second = (int(match[name]) for name in ("day", "hour", "minute", "second"))
    month = _MONTHS[match["month"]]
    # 60 is a leap second; anything else out of range is not a date.
    if not (
        year >= 1
        and 1 <= day <= calendar.monthrange(year, month)[1]
        and hour <= 23
        and minute <= 59
        and second <= 60
    ):
        return None
    return float(calendar.timegm((year, month, day, hour, minute, second, 0, 0, 0)))


def parse_retry_after(value: str, *, now: float) -> float | None:
    """Return the wait in seconds a ``Retry-After`` value asks for, or None if it is garbage.

    ``now`` is the current Unix time (``time.time()``). A date in the past
    means 0. Never raises: ``"-1"``, ``"1.0"``, ``"inf"`` or a year 99999 give None.

    >>> parse_retry_after("\\t42 ", now=0.0)
    42.0
    >>> parse_retry_after("Thu, 01 Jan 1970 00:01:00 GMT", now=30.0)
    30.0
    """
    seconds = parse_delay_seconds(value)
    if seconds is not None:
        return float(seconds)
    when = parse_http_date(value, now=now)
    if when is None:
        return None
    return max(0.0, when - now)

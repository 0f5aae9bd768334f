"""Rates such as ``10/minute``, parsed with the ``limits`` package's grammar."""

from __future__ import annotations

import math
from dataclasses import dataclass

from limits import parse_many
from limits.util import SEPARATORS, SINGLE_EXPR

from .errors import ConfigError

__all__ = ["Rate", "parse_rate", "split_rates"]

_YEAR = 365 * 86400
_UNITS = (("year", _YEAR), ("month", 30 * 86400), ("day", 86400), ("hour", 3600),
          ("minute", 60), ("second", 1))
_EXAMPLES = "expected e.g. '10/minute', '100 per hour', '5/30 seconds' or '10/minute; 1000/day'"

MAX_PERIOD = 10 * _YEAR
"""The longest period (and the longest time a bucket may take to refill), in seconds:
ten years. Times are counted in microseconds, and Redis's Lua counts them in doubles,
exact only below 2**53 µs (about 285 years after 1970): far-off times would lose
whole microseconds and the algorithms' exact searches for the retry time would never
end."""
MAX_AMOUNT = 10**12
"""The most requests a limit may count: exact in a double with room for every sum."""


@dataclass(frozen=True, slots=True)
class Rate:
    """``amount`` requests per ``period`` seconds; ``str(Rate(10, 60))`` is ``10/minute``."""

    amount: int
    period: float

    def __post_init__(self) -> None:
        if (isinstance(self.amount, bool) or not isinstance(self.amount, int)
                or not 1 <= self.amount <= MAX_AMOUNT):
            msg = (f"rate amount must be a positive integer of at most {MAX_AMOUNT:,}, "
                   f"got {self.amount!r}")
            raise ConfigError(msg)
        if (
            isinstance(self.period, bool)
            or not isinstance(self.period, int | float)
            or not math.isfinite(self.period)
            or self.period * 1_000_000 < 1
        ):
            msg = f"rate period must be a positive number of seconds, got {self.period!r}"
            raise ConfigError(msg)
        if self.period > MAX_PERIOD:
            msg = (f"rate period must be at most ten years ({MAX_PERIOD} seconds), got "
                   f"{self.period:.0f} seconds")
            raise ConfigError(msg)

    @property
    def period_us(self) -> int:
        """The period in whole microseconds, the unit every algorithm counts in."""
        return round(self.period * 1_000_000)

    def __str__(self) -> str:
        for name, seconds in _UNITS:
            if self.period == seconds:
                return f"{self.amount}/{name}"
        for name, seconds in _UNITS:
            if self.period % seconds == 0:
                return f"{self.amount}/{self.period // seconds:g} {name}s"
        return f"{self.amount}/{self.period:g} seconds"


def split_rates(value: object) -> list[Rate]:
    """Parse one or more rates separated by ``;``, ``,`` or ``|`` (``as_limits`` builds
    limits from them)."""
    if not isinstance(value, str):
        msg = f"couldn't parse rate {value!r}: not a string; {_EXAMPLES}"
        raise ConfigError(msg)
    try:
        items = parse_many(value.strip())
    except ValueError as exc:
        msg = f"couldn't parse rate {value!r}; {_EXAMPLES}"
        raise ConfigError(msg) from exc
    # limits reads "5/0 seconds" as "5/second"; a zero period must be an error instead.
    for part in SEPARATORS.split(value.strip()):
        match = SINGLE_EXPR.match(part)
        if match and match.group(3) is not None and int(match.group(3)) == 0:
            msg = f"rate {value!r} has a zero period; {_EXAMPLES}"
            raise ConfigError(msg)
    rates = []
    for item in items:
        if item.amount <= 0:
            msg = f"rate {value!r} allows no request at all; the amount must be at least 1"
            raise ConfigError(msg)
        period = item.get_expiry()
        if item.GRANULARITY.name == "year":  # limits counts a year as 12 months of 30 days
            period = item.multiples * _YEAR
        try:
            rates.append(Rate(item.amount, period))
        except ConfigError as exc:
            msg = f"rate {value!r}: {exc}"
            raise ConfigError(msg) from None
    return rates


def parse_rate(value: object) -> Rate:
    """Parse exactly one rate (a ``Rate`` passes through)."""
    if isinstance(value, Rate):
        return value
    rates = split_rates(value)
    if len(rates) != 1:
        msg = f"expected a single rate, got {len(rates)} in {value!r}"
        raise ConfigError(msg)
    return rates[0]

"""Server hints: how long a response asks us to wait, from ``Retry-After`` or quota headers.

A hint parser takes the response headers and the current Unix time and
returns seconds to wait, or None. Parsers never raise on bad input: they log
it and return None, so the caller falls back to backoff. Epoch headers and
duration headers are read by different parsers, so one is never taken for
the other.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import TYPE_CHECKING, NamedTuple, TypeAlias

from .log import logger
from .retry_after import parse_delay_seconds, parse_retry_after

if TYPE_CHECKING:
    import httpx

__all__ = [
    "DEFAULT_HINTS",
    "HintParser",
    "Quota",
    "duration_hint",
    "github_quota",
    "github_reset_hint",
    "ratelimit_header_hint",
    "ratelimit_quota",
    "read_quota",
    "retry_after_hint",
]

HintParser: TypeAlias = "Callable[[httpx.Headers, float], float | None]"
"""``(headers, now) -> seconds to wait or None``; ``now`` is Unix time."""

# An epoch reset earlier than 2001-09-09 is not an epoch: it is a duration
# sent under an epoch header's name. Refuse it rather than guess.
_MIN_PLAUSIBLE_EPOCH = 1_000_000_000

# Real RateLimit fields are a few dozen bytes; a longer one is not worth reading.
_MAX_FIELD = 4096
# Values a proxy may have joined into one Retry-After line; more are not worth reading.
_MAX_JOINED = 8


class Quota(NamedTuple):
    """What a server says is left: ``remaining`` requests, restored in ``reset_after`` s."""

    remaining: int | None
    reset_after: float | None


def _clip(value: str) -> str:
    """Shorten a header value for a log line; a hostile server can send megabytes."""
    return value if len(value) <= 80 else f"{value[:80]}..."


def _int_header(headers: httpx.Headers, name: str) -> int | None:
    """Return a header made of digits only, logging and dropping anything else."""
    value = headers.get(name)
    if value is None:
        return None
    number = parse_delay_seconds(value)
    if number is None:
        logger.warning("ignoring %s header %r: expected a non-negative integer", name, _clip(value))
    return number


def github_quota(headers: httpx.Headers, now: float) -> Quota | None:
    """Read GitHub-style ``x-ratelimit-remaining`` and ``x-ratelimit-reset`` (epoch seconds)."""
    remaining = _int_header(headers, "x-ratelimit-remaining")
    reset = _int_header(headers, "x-ratelimit-reset")
    if reset is not None and reset < _MIN_PLAUSIBLE_EPOCH:
        logger.warning(
            "ignoring x-ratelimit-reset %d: not an epoch time; "
            "for a duration header use duration_hint('x-ratelimit-reset')",
            reset,
        )
        reset = None
    if remaining is None and reset is None:
        return None
    return Quota(remaining, None if reset is None else max(0.0, reset - now))


def _split_unquoted(value: str, separator: str) -> list[str]:
    """Split on ``separator`` outside quoted strings, in one pass (no regex backtracking)."""
    parts: list[str] = []
    start, quoted, escaped = 0, False, False
    for index, char in enumerate(value):
        if escaped:
            escaped = False
        elif quoted and char == "\\":
            escaped = True
        elif char == '"':
            quoted = not quoted
        elif char == separator and not quoted:
            parts.append(value[start:index].strip(" \t"))
            start = index + 1
    parts.append(value[start:].strip(" \t"))
    return parts


def _structured_quota(value: str) -> Quota | None:
    """Read a ``RateLimit`` field: draft-11 items (``r``, ``t``) or a draft-7 dictionary."""
    items: list[dict[str, str]] = []
    dictionary: dict[str, str] = {}
    members = _split_unquoted(value, ",") if len(value) <= _MAX_FIELD else []
    for member in filter(None, members):
        head, *params = _split_unquoted(member, ";")
        key, equals, bare = head.partition("=")
        if equals and not head.startswith('"'):  # draft-7: limit=5, remaining=0, reset=30
            dictionary[key.strip(" \t").lower()] = bare.strip(" \t")
        else:  # draft-11: "burst";r=0;t=30
            items.append(
                {k.strip(" \t"): v.strip(" \t") for k, _, v in (p.partition("=") for p in params)}
            )
    if dictionary:
        items.append({"r": dictionary.get("remaining", ""), "t": dictionary.get("reset", "")})
    quotas: list[Quota] = []
    for item in items:
        remaining = parse_delay_seconds(item.get("r", ""))
        reset = parse_delay_seconds(item.get("t", ""))
        if remaining is None and reset is None:
            continue
        quotas.append(Quota(remaining, None if reset is None else float(reset)))
    if not quotas:
        logger.warning(
            "ignoring RateLimit header %r: no r/t or remaining/reset in it", _clip(value)
        )
        return None
    # The policy closest to exhaustion decides; among exhausted ones, the longest wait.
    return min(quotas, key=_closest_to_exhaustion)


def _closest_to_exhaustion(quota: Quota) -> tuple[float, float]:
    """Sort key: lowest remaining first (unknown last), then the longest reset."""
    remaining = float("inf") if quota.remaining is None else quota.remaining
    return (remaining, -(quota.reset_after or 0.0))


def ratelimit_quota(headers: httpx.Headers, now: float) -> Quota | None:
    """Read the IETF headers: draft-11/draft-7 ``RateLimit`` or draft-6 ``RateLimit-Reset``.

    ``now`` is unused (these are durations) but kept for the parser signature.
    """
    value = headers.get("ratelimit")
    if value is not None:
        return _structured_quota(value)
    remaining = _int_header(headers, "ratelimit-remaining")
    reset = _int_header(headers, "ratelimit-reset")
    if remaining is None and reset is None:
        return None
    return Quota(remaining, None if reset is None else float(reset))


def read_quota(headers: httpx.Headers, now: float) -> Quota | None:
    """Return the quota a response reports in any known style, IETF first, else None."""
    return ratelimit_quota(headers, now) or github_quota(headers, now)


def _retry_after_waits(value: str, now: float) -> list[float]:
    """The waits of one ``Retry-After`` field line: its value, else the values a proxy
    joined with commas (an HTTP-date holds a comma of its own, so two pieces are tried
    together too)."""
    wait = parse_retry_after(value, now=now)
    if wait is not None:
        return [wait]
    pieces = value.split(",", _MAX_JOINED)[:_MAX_JOINED]
    candidates = [*pieces, *(",".join(pair) for pair in itertools.pairwise(pieces))]
    return [w for c in candidates if (w := parse_retry_after(c, now=now)) is not None]


def retry_after_hint(headers: httpx.Headers, now: float) -> float | None:
    """Return the wait ``Retry-After`` asks for; garbage is logged and gives None.

    A repeated header (or values a proxy joined into one) asks for the longest of its
    valid waits: each is a minimum, never to be cut short.
    """
    values = headers.get_list("retry-after")
    if not values:
        return None
    waits = [wait for value in values for wait in _retry_after_waits(value, now)]
    if not waits:
        logger.warning(
            "ignoring Retry-After %r: expected delay-seconds or an HTTP-date",
            _clip(", ".join(values)),
        )
        return None
    return max(waits)


def github_reset_hint(headers: httpx.Headers, now: float) -> float | None:
    """Return the wait until ``x-ratelimit-reset`` (epoch) when ``x-ratelimit-remaining`` is 0."""
    quota = github_quota(headers, now)
    if quota is None or quota.remaining != 0:
        return None
    return quota.reset_after


def ratelimit_header_hint(headers: httpx.Headers, now: float) -> float | None:
    """Return the IETF ``RateLimit`` reset (``t=``, ``reset=``, ``RateLimit-Reset``) when exhausted.

    The reset counts when the remaining quota is 0 or not stated.
    """
    quota = ratelimit_quota(headers, now)
    if quota is None or quota.remaining not in (0, None):
        return None
    return quota.reset_after


def duration_hint(header: str, *, remaining_header: str | None = None) -> HintParser:
    """Make a hint parser for a provider header holding a duration in seconds.

    With ``remaining_header``, the duration only counts when that header is 0.

    >>> import httpx
    >>> hint = duration_hint("x-ratelimit-reset-after")
    >>> hint(httpx.Headers({"x-ratelimit-reset-after": "7"}), 0.0)
    7.0
    """

    def hint(headers: httpx.Headers, now: float) -> float | None:
        if remaining_header is not None and _int_header(headers, remaining_header) != 0:
            return None
        seconds = _int_header(headers, header)
        return None if seconds is None else float(seconds)

    return hint


DEFAULT_HINTS: tuple[HintParser, ...] = (
    retry_after_hint,
    github_reset_hint,
    ratelimit_header_hint,
)
"""Hint parsers tried in order; the first that answers wins, so ``Retry-After`` comes first."""

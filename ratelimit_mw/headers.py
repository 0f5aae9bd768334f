"""Rate-limit response headers: legacy ``X-RateLimit-*`` and the IETF drafts 6, 7 and 11.

What depends only on the limits (policy descriptions) is formatted once per set of
limits; per request only the numbers are written.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import math
from collections.abc import Mapping, Sequence
from typing import Final, Literal, get_args

from mypy_extensions import mypyc_attr

from .asgi import Header
from .decision import Decision, Verdict, binding_of
from .errors import ConfigError
from .limits import Limit, LimitKey

__all__ = [
    "HEADER_STYLES",
    "HeaderFormat",
    "HeaderStyle",
    "parse_header_style",
    "partition_key",
    "policy_label",
    "policy_name",
    "retry_after_value",
]

HeaderStyle = Literal["legacy", "draft-6", "draft-7", "draft-11"]
HEADER_STYLES: tuple[HeaderStyle, ...] = get_args(HeaderStyle)
_IETF: Final = ("draft-6", "draft-7", "draft-11")


def parse_header_style(value: str) -> tuple[HeaderStyle, ...]:
    """``"legacy"``, ``"draft-11"``, ``"legacy+draft-11"`` … or ``"none"`` (no headers)."""
    text = str(value).strip().lower().replace("_", "-")
    if text in ("", "none", "off"):
        return ()
    styles: list[HeaderStyle] = []
    for part in text.split("+"):
        part = part.strip().replace("draft", "draft-").replace("draft--", "draft-")
        style = next((s for s in HEADER_STYLES if s == part), None)
        if style is None or style in styles:
            msg = (f"unknown header style {value!r}; expected one of {', '.join(HEADER_STYLES)}, "
                   f"legacy combined with one IETF style (e.g. 'legacy+draft-11'), or 'none'")
            raise ConfigError(msg)
        styles.append(style)
    if sum(style in _IETF for style in styles) > 1:
        msg = (f"header style {value!r} combines IETF drafts whose headers collide; "
               f"pick one of {', '.join(_IETF)} (optionally with legacy)")
        raise ConfigError(msg)
    return tuple(styles)


def retry_after_value(seconds: float) -> bytes | None:
    """RFC 9110 delay-seconds, rounded up so it never points earlier than the real wait."""
    if not math.isfinite(seconds):
        return None
    return str(max(0, math.ceil(seconds))).encode()


def policy_label(name: str) -> str:
    """A policy name as the headers spell it, before escaping: printable ASCII, every
    other character ``_`` (what a client reads back; the problem+json body names it so)."""
    return "".join(c if " " <= c <= "~" else "_" for c in name)


def policy_name(name: str) -> str:
    """A policy name as a structured-field string's content (printable ASCII, escaped)."""
    return policy_label(name).replace("\\", "\\\\").replace('"', '\\"')


@functools.lru_cache(maxsize=1024)
def _window(limit: Limit) -> int:
    return max(1, math.ceil(limit.period))


def _unit(limit: Limit) -> str:
    """``;qu="tokens"``: draft-11's quota unit, for a limit counting other than requests."""
    return "" if limit.unit == "requests" else f';qu="{limit.unit}"'


def _short_policy(limit: Limit) -> bytes:
    """``100;w=60``: the draft-6/7 policy of one limit (``2`` for a concurrency slot)."""
    if limit.is_concurrency:
        return str(limit.capacity).encode()
    return f"{limit.capacity};w={_window(limit)}".encode()


# A limit's texts: (the limit, X-RateLimit-Limit, X-RateLimit-Policy, the draft-6/7
# policy). Found by identity (a Limit's own hash is a Python-level call, and this runs
# per request); each entry holds its limit, so the id stays that limit's.
_Texts = tuple[Limit, Header, Header, bytes]
_TEXTS: Final[dict[int, _Texts]] = {}


def _texts(limit: Limit) -> _Texts:
    """The header texts that depend on ``limit`` alone, made once per limit."""
    texts = _TEXTS.get(id(limit))
    if texts is None or texts[0] is not limit:
        if len(_TEXTS) >= 1024:
            _TEXTS.clear()
        texts = _TEXTS[id(limit)] = (
            limit, (b"x-ratelimit-limit", b"%d" % limit.capacity),
            (b"x-ratelimit-policy", _legacy_policy(limit)), _short_policy(limit))
    return texts


def _legacy_policy(limit: Limit) -> bytes:
    """``100;w=60;comment="per minute"``."""
    if limit.is_concurrency:
        return f'{limit.capacity};comment="concurrent requests"'.encode()
    per = str(limit.rate).split("/", 1)[1]
    words = f"{limit.rate.amount} per {per}" if limit.burst is not None else f"per {per}"
    if limit.burst is not None:
        words = f"burst {limit.burst}, {words}"
    return f'{limit.capacity};w={_window(limit)};comment="{policy_name(words)}"'.encode()


@mypyc_attr(allow_interpreted_subclasses=True)
class HeaderFormat:
    """Writes the headers of one header style (or a legacy + IETF combination)."""

    __slots__ = ("_reset", "_texts", "ietf", "legacy", "partition_key", "styles")

    def __init__(
        self, style: str | Sequence[HeaderStyle] = "legacy", *, partition_key: object = False,
    ) -> None:
        self.styles = parse_header_style(style) if isinstance(style, str) else tuple(style)
        self.legacy = "legacy" in self.styles
        self.ietf = next((s for s in self.styles if s in _IETF), None)
        self.partition_key = bool(partition_key)
        """draft-11: add each caller's ``pk`` to the ``RateLimit`` items."""
        # The last binding limit's texts and the last X-RateLimit-Reset sent: most
        # requests report the limit and the reset second of the one before.
        self._texts: _Texts | None = None
        self._reset: tuple[int, Header] = (-1, (b"", b""))

    def __bool__(self) -> bool:
        return bool(self.styles)

    def static(self, named: Sequence[tuple[str, Limit]]) -> list[Header]:
        """Headers that depend only on the limits: draft-11 ``RateLimit-Policy``.

        A concurrency slot is a policy of unit ``qu="concurrent-requests"`` and no window.
        """
        if self.ietf != "draft-11" or not named:
            return []
        items = ",".join(
            f'"{policy_name(name)}";q={limit.capacity};qu="concurrent-requests"'
            if limit.is_concurrency else
            f'"{policy_name(name)}";q={limit.capacity};w={_window(limit)}{_unit(limit)}'
            for name, limit in named)
        return [(b"ratelimit-policy", items.encode())]

    def dynamic(
        self, verdict: Verdict, names: Mapping[LimitKey, str], now: float, key: str = "",
        metered: bool = False,
    ) -> list[Header]:
        """The per-request headers for ``verdict`` (``now`` in epoch seconds) of the
        caller ``key``: of the limits ``names`` names (a limit set's enforced limits), or of
        every limit when it names none. ``metered``: some limit counts a unit other than
        requests (tokens): reported apart, under its unit's suffix, in the styles with a
        header per figure."""
        decisions = verdict.decisions
        allowed = verdict.allowed
        if 0 < len(names) < len(decisions):
            # Shadow limits hold nobody back: a client must not pace itself by them.
            decisions = tuple(d for d in decisions if (d.scope, d.limit) in names)
            allowed = all(d.allowed for d in decisions)
        if not decisions:
            return []
        if metered:
            return self._metered(verdict, decisions, names, now, key)
        binding = binding_of(decisions, allowed)
        reset_after = binding.reset_after
        if binding.limit.is_concurrency:
            # A slot frees when some request ends: the retry hint, not the lease.
            reset_after = binding.retry_after
        out: list[Header] = []
        if self.legacy:
            texts = self._texts
            if texts is None or texts[0] is not binding.limit:
                texts = self._texts = _texts(binding.limit)
            limit, policy = texts[1], texts[2]
            if binding.quota != binding.limit.capacity:  # a custom storage's own say
                limit = (b"x-ratelimit-limit", b"%d" % binding.quota)
            reset = self._reset
            at = math.ceil(now + reset_after)
            if reset[0] != at:
                reset = self._reset = (at, (b"x-ratelimit-reset", b"%d" % at))
            out = [limit, (b"x-ratelimit-remaining", b"%d" % binding.remaining), reset[1],
                   policy]
        ietf = self.ietf
        if ietf is None:  # the legacy headers alone
            return out
        if ietf == "draft-11":
            out.append((b"ratelimit", _draft11(
                decisions, names, partition_key(key) if self.partition_key else "")))
        elif ietf == "draft-7":
            out += (
                (b"ratelimit", b"limit=%d, remaining=%d, reset=%d" % (
                    binding.quota, binding.remaining, math.ceil(reset_after))),
                (b"ratelimit-policy", _texts(binding.limit)[3]),
            )
        elif ietf == "draft-6":
            out += (
                (b"ratelimit-limit", b"%d" % binding.quota),
                (b"ratelimit-remaining", b"%d" % binding.remaining),
                (b"ratelimit-reset", b"%d" % math.ceil(reset_after)),
                (b"ratelimit-policy", _texts(binding.limit)[3]),
            )
        return out

    def _metered(self, verdict: Verdict, decisions: Sequence[Decision],
                 names: Mapping[LimitKey, str], now: float, key: str) -> list[Header]:
        """``dynamic``, with limits of other units than requests: the request limits as
        usual, and each other unit's binding limit under its suffix
        (``X-RateLimit-Remaining-Tokens``); draft-11 lists every policy as always."""
        requests = tuple(d for d in decisions if d.limit.unit == "requests")
        out = self.dynamic(verdict._replace(decisions=requests), names, now, key
                           ) if requests else []
        if self.ietf == "draft-11":
            out = [header for header in out if header[0] != b"ratelimit"]
            out.append((b"ratelimit", _draft11(
                decisions, names, partition_key(key) if self.partition_key else "")))
        by_unit: dict[str, list[Decision]] = {}
        for d in decisions:
            if d.limit.unit != "requests":
                by_unit.setdefault(d.limit.unit, []).append(d)
        for unit, metered in by_unit.items():
            binding = binding_of(metered, all(d.allowed for d in metered))
            suffix = b"-" + unit.encode()
            if self.legacy:
                out += (
                    (b"x-ratelimit-limit" + suffix, b"%d" % binding.quota),
                    (b"x-ratelimit-remaining" + suffix, b"%d" % binding.remaining),
                    (b"x-ratelimit-reset" + suffix,
                     b"%d" % math.ceil(now + binding.reset_after)),
                )
            if self.ietf == "draft-6":
                out += (
                    (b"ratelimit-limit" + suffix, b"%d" % binding.quota),
                    (b"ratelimit-remaining" + suffix, b"%d" % binding.remaining),
                    (b"ratelimit-reset" + suffix, b"%d" % math.ceil(binding.reset_after)),
                )
        return out


_NAMES: Final[dict[str, str]] = {}  # policy name -> policy_name(name), looked up per request


def _written(name: str) -> str:
    """``policy_name(name)``, made once per name."""
    written = _NAMES.get(name)
    if written is None:
        if len(_NAMES) >= 1024:
            _NAMES.clear()
        written = _NAMES[name] = policy_name(name)
    return written


def _draft11(
    decisions: Sequence[Decision], names: Mapping[LimitKey, str], pk: str = "",
) -> bytes:
    """``"burst";r=50;t=30,"daily";r=999;t=86400``: every policy's remaining quota
    (a concurrency slot: free slots, ``t`` only while none is free), each item ending
    in ``pk`` (the partition key parameter, if any)."""
    parts = []
    for d in decisions:
        name = _written(names.get((d.scope, d.limit)) or d.limit.name)
        if d.limit.is_concurrency:
            parts.append(f'"{name}";r={d.remaining}{pk}' if d.allowed else
                         f'"{name}";r={d.remaining};t={math.ceil(d.retry_after)}{pk}')
            continue
        parts.append(f'"{name}";r={d.remaining};t={math.ceil(d.reset_after)}{pk}')
    return ",".join(parts).encode()


@functools.lru_cache(maxsize=4096)
def partition_key(key: str) -> str:
    """``;pk=:…:``: the draft-11 partition key of a caller, a byte sequence that tells
    callers apart without showing their key (12 bytes of its BLAKE2b digest)."""
    digest = hashlib.blake2b(key.encode("utf-8", "surrogateescape"), digest_size=12).digest()
    return f";pk=:{base64.b64encode(digest).decode()}:"

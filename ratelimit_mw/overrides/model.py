"""An override: one caller's tier, custom limits or block, set at run time.

An override names its caller by the key the limits count for (``apikey:…``,
``user:…``, ``ip:…``) or by a network (``net:10.0.0.0/8``, matching every ``ip:`` key
inside it), and says one of three things: count the caller on another ``tier``,
count it on custom ``limits`` (with an optional ``concurrency``), or admit nothing
until ``blocked_until``. ``expires_at`` ends it; the caller is then back on its own
tier. Values are checked when built, each error naming its field
(``OverrideError.field``), so an admin API can answer 422 with it.
"""

from __future__ import annotations

import ipaddress
import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..errors import ConfigError
from ..identity import _digest
from ..limits import Limit, as_limits
from ..tiers import Tier

__all__ = ["MAX_CALLER", "Override", "OverrideError", "caller_key", "limits_from_json"]

MAX_CALLER = 256
"""The longest caller reference (and key) an override accepts, in characters."""
MAX_LIMITS = 16
MAX_TEXT = 200  # a plan name or a reason
_FAR = 253402300800.0  # 10000-01-01T00:00:00Z: later times are refused


class OverrideError(ConfigError):
    """An override that can't be applied; ``field`` names the bad part."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


def caller_key(reference: object) -> str:
    """The key the limits count a caller for, from a reference an operator writes.

    ``api_key:SECRET`` (hashed as the ``api_key`` key function hashes it), ``user:ID``,
    ``ip:ADDRESS``, ``network:CIDR``, or ``key:K`` for a key exactly as the key
    function returns it (so ``key:`` and a listed override's ``caller`` fetch it).
    """
    if not isinstance(reference, str) or not reference.strip():
        raise OverrideError("caller", "expected a string such as 'api_key:SECRET', "
                                      "'user:ID', 'ip:ADDRESS' or 'network:CIDR'")
    text = reference.strip()
    if len(text) > MAX_CALLER:
        raise OverrideError("caller", f"at most {MAX_CALLER} characters, got {len(text)}")
    kind, sep, value = text.partition(":")
    if not sep or not value:
        raise OverrideError("caller", f"{text[:60]!r} has no kind; expected e.g. "
                                      f"'api_key:SECRET' or 'ip:203.0.113.7'")
    if kind == "api_key":
        return f"apikey:{_digest(value)}"
    if kind == "user":
        return f"user:{_digest(value)}"
    if kind == "apikey":  # the stored form: only a digest is ever kept
        return text
    if kind == "key":
        return value
    if kind == "ip":
        try:
            return f"ip:{ipaddress.ip_address(value)}"
        except ValueError:
            try:
                return f"ip:{ipaddress.ip_network(value, strict=False)}"
            except ValueError:
                raise OverrideError("caller", f"{value[:60]!r} is not an IP address") from None
    if kind in ("network", "net"):
        try:
            return f"net:{ipaddress.ip_network(value, strict=False)}"
        except ValueError:
            raise OverrideError("caller", f"{value[:60]!r} is not a network such as "
                                          f"'10.0.0.0/8'") from None
    raise OverrideError("caller", f"unknown kind {kind[:30]!r}; expected api_key, user, ip, "
                                  f"network or key")


@dataclass(frozen=True, slots=True)
class Override:
    """What one caller gets instead of its tier, until ``expires_at`` (epoch seconds).

    Exactly one of ``tier``, ``limits`` (custom; ``plan`` names them in the quota
    report and the logs) or ``blocked_until`` is set.

    >>> Override("apikey:0f", limits="5000/minute", plan="acme").describe()
    "custom limits 'acme': sliding_window 5000/minute"
    """

    caller: str
    tier: str | None = None
    limits: tuple[Limit, ...] | str = ()
    concurrency: int | None = None
    plan: str = "custom"
    blocked_until: float | None = None
    expires_at: float | None = None
    reason: str = ""
    set_by: str = ""
    set_at: float = 0.0
    network: ipaddress.IPv4Network | ipaddress.IPv6Network | None = field(
        init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.caller, str) or not self.caller or len(self.caller) > MAX_CALLER:
            raise OverrideError("caller", f"a key of 1 to {MAX_CALLER} characters, got "
                                          f"{str(self.caller)[:60]!r}")
        network = None
        if self.caller.startswith("net:"):
            network = ipaddress.ip_network(self.caller[4:], strict=False)
        object.__setattr__(self, "network", network)
        try:
            limits = as_limits(self.limits) if self.limits else ()
        except ConfigError as exc:
            raise OverrideError("limits", str(exc)) from None
        if len(limits) > MAX_LIMITS:
            raise OverrideError("limits", f"at most {MAX_LIMITS} limits, got {len(limits)}")
        object.__setattr__(self, "limits", limits)
        given = [name for name, value in (("tier", self.tier), ("limits", limits or None),
                                          ("blocked_until", self.blocked_until))
                 if value is not None]
        if self.concurrency is not None and "limits" not in given:
            given.append("limits")  # concurrency alone is a custom plan too
        if len(given) != 1:
            raise OverrideError("override", f"give exactly one of tier, limits or "
                                            f"blocked_until (got {', '.join(given) or 'none'})")
        if self.tier is not None and (not isinstance(self.tier, str) or not self.tier.strip()):
            raise OverrideError("tier", f"a tier name, got {self.tier!r}")
        if self.concurrency is not None and (
                isinstance(self.concurrency, bool) or not isinstance(self.concurrency, int)
                or not 1 <= self.concurrency <= 1_000_000):
            raise OverrideError("concurrency", f"a whole number from 1 to 1000000, got "
                                               f"{self.concurrency!r}")
        for name in ("plan", "reason", "set_by"):
            value = getattr(self, name)
            if not isinstance(value, str) or len(value) > MAX_TEXT:
                raise OverrideError(name, f"text of at most {MAX_TEXT} characters")
        if not self.plan.strip():
            raise OverrideError("plan", "a non-empty name")
        for name in ("blocked_until", "expires_at"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)
                                      or not 0 < value < _FAR):
                raise OverrideError(name, f"a time from 1970 to 9999, got {value!r}")
        if self.limits or self.concurrency is not None:
            self.custom_tier()  # limits no tier can hold fail here, not per request

    @property
    def blocks(self) -> bool:
        """True for a block (it admits nothing until ``blocked_until``)."""
        return self.blocked_until is not None

    @property
    def ends_at(self) -> float:
        """When the override stops applying (``math.inf``: never)."""
        ends = [t for t in (self.expires_at, self.blocked_until) if t is not None]
        return min(ends) if ends else math.inf

    def custom_tier(self) -> Tier:
        """The tier of an override with custom ``limits``, named by its ``plan``."""
        try:
            return Tier(self.plan, self.limits, self.concurrency)
        except ConfigError as exc:
            raise OverrideError("limits", str(exc)) from None

    def describe(self) -> str:
        """A short account for a log line or the command line."""
        if self.tier is not None:
            return f"tier {self.tier!r}"
        if self.blocked_until is not None:
            return f"blocked until {self.blocked_until:.0f}"
        shown = "; ".join(str(limit) for limit in self.limits)
        if self.concurrency is not None:
            shown += f"{'; ' if shown else ''}concurrency {self.concurrency}"
        return f"custom limits {self.plan!r}: {shown}"

    def to_dict(self) -> dict[str, Any]:
        """The JSON form the stores keep and the admin API shows."""
        out: dict[str, Any] = {"caller": self.caller}
        if self.tier is not None:
            out["tier"] = self.tier
        if self.limits:
            out["plan"] = self.plan
            out["limits"] = [_limit_dict(limit) for limit in as_limits(self.limits)]
        if self.concurrency is not None:
            out["plan"] = self.plan
            out["concurrency"] = self.concurrency
        for name in ("blocked_until", "expires_at"):
            if getattr(self, name) is not None:
                out[name] = getattr(self, name)
        out.update(reason=self.reason, set_by=self.set_by, set_at=self.set_at)
        return out

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), separators=(",", ":"), sort_keys=True)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Override:
        """An override from its JSON form (as ``to_dict`` writes it)."""
        limits = limits_from_json(data.get("limits") or ())
        return cls(
            caller=data["caller"], tier=data.get("tier"), limits=limits,
            concurrency=data.get("concurrency"), plan=data.get("plan", "custom"),
            blocked_until=data.get("blocked_until"), expires_at=data.get("expires_at"),
            reason=data.get("reason", ""), set_by=data.get("set_by", ""),
            set_at=data.get("set_at", 0.0))

    @classmethod
    def from_json(cls, text: str | bytes) -> Override:
        return cls.from_dict(json.loads(text))


def _limit_dict(limit: Limit) -> dict[str, Any]:
    out: dict[str, Any] = {"rate": str(limit.rate), "algorithm": limit.algorithm,
                           "name": limit.name}
    if limit.burst is not None:
        out["burst"] = limit.burst
    return out


_LIMIT_FIELDS = frozenset({"rate", "algorithm", "burst", "name"})


def limits_from_json(items: Iterable[object]) -> tuple[Limit, ...]:
    """The limits of a JSON ``limits`` list (an OverrideError naming the bad item)."""
    return tuple(_limit_from(item, i) for i, item in enumerate(items))


def _limit_from(item: object, index: int) -> Limit:
    """One limit of a JSON ``limits`` list: ``"10/minute"`` or ``{"rate": …,
    "algorithm": …, "burst": …, "name": …}``."""
    where = f"limits[{index}]"
    try:
        if isinstance(item, str):
            return Limit(item)
        if not isinstance(item, dict) or "rate" not in item:
            raise OverrideError(where, "expected a rate string or an object with 'rate'")
        unknown = sorted(set(item) - _LIMIT_FIELDS)
        if unknown:
            raise OverrideError(where, f"unknown field(s) {unknown}; expected "
                                       f"{sorted(_LIMIT_FIELDS)}")
        limit = Limit(item["rate"], item.get("algorithm", "sliding_window"),
                      burst=item.get("burst"), name=item.get("name") or "")
    except OverrideError:
        raise
    except ConfigError as exc:
        raise OverrideError(where, str(exc)) from None
    if limit.is_concurrency:
        raise OverrideError(where, "give concurrency= for requests in flight")
    return limit

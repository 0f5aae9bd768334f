"""Tiers: named sets of limits, and the resolvers that pick one per request."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from starlette.types import Scope

from .asgi import first_header_value
from .checks import header_name
from .client_ip import TrustedProxies
from .errors import ConfigError
from .hits import Hit
from .limits import Limit, as_limits

__all__ = ["Tier", "TierByAPIKey", "TierFromHeader", "TierResolver", "TierTable"]

TierResolver = Callable[[Scope], "str | Awaitable[str | None] | None"]
"""Picks a tier name for a request (``None``: the default tier); may be async."""

_log = logging.getLogger("ratelimit_mw")


@dataclass(frozen=True, slots=True)
class Tier:
    """A tier: the limits every request of its callers counts against.

    ``shadow`` names limits that are decided, reported and logged but never block.
    ``concurrency`` caps the requests in flight per key: a slot is taken with the
    rate limits, in the same atomic call, and given back when the response ends
    (on Redis it is a lease that expires, so a killed worker can't hold it forever).

    >>> Tier("free", [Limit("10/minute", "token_bucket", burst=20, name="burst"),
    ...               Limit("1000/day", name="daily")]).names
    ('burst', 'daily')
    """

    name: str
    limits: Sequence[Limit] | str = ()
    concurrency: int | None = None
    shadow: frozenset[str] = frozenset()
    hits: tuple[Hit, ...] = field(init=False, repr=False, compare=False)
    metered: bool = field(init=False, repr=False, compare=False)
    """True when some limit counts another unit than requests: charged only on routes
    that spend it (``@spends``)."""

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name.strip():
            msg = f"a tier needs a non-empty name, got {self.name!r}"
            raise ConfigError(msg)
        limits = as_limits(self.limits)
        object.__setattr__(self, "limits", limits)
        names = [limit.name for limit in limits]
        for name in names:
            if names.count(name) > 1:
                msg = (f"tier {self.name!r} has two limits named {name!r}; give each "
                       f"a distinct name= (it names the policy in headers)")
                raise ConfigError(msg)
        if self.concurrency is not None and (
            isinstance(self.concurrency, bool) or not isinstance(self.concurrency, int)
            or self.concurrency < 1
        ):
            msg = (f"tier {self.name!r}: concurrency must be a positive integer or None, "
                   f"got {self.concurrency!r}")
            raise ConfigError(msg)
        shadow = frozenset([self.shadow] if isinstance(self.shadow, str) else self.shadow)
        unknown = sorted(shadow.difference(names))
        if unknown:
            msg = (f"tier {self.name!r}: shadow names unknown limit(s) {unknown}; "
                   f"its limits are {names}")
            raise ConfigError(msg)
        object.__setattr__(self, "shadow", shadow)
        object.__setattr__(self, "hits", tuple(Hit(limit) for limit in limits))
        object.__setattr__(self, "metered", any(limit.unit != "requests" for limit in limits))

    @property
    def names(self) -> tuple[str, ...]:
        """The names of the tier's limits, in order."""
        return tuple(limit.name for limit in self.limits)  # type: ignore[union-attr]


class TierTable:
    """The known tiers and the default one; turns a resolver's answer into a Tier."""

    __slots__ = ("_reported", "default", "tiers")

    def __init__(self, tiers: Mapping[str, Tier] | Iterable[Tier], default: str | None = None):
        items = list(tiers.values()) if isinstance(tiers, Mapping) else list(tiers)
        table: dict[str, Tier] = {}
        for tier in items:
            if not isinstance(tier, Tier):
                msg = f"expected Tier objects, got {tier!r}"
                raise ConfigError(msg)
            if tier.name in table:
                msg = f"two tiers are named {tier.name!r}"
                raise ConfigError(msg)
            table[tier.name] = tier
        if not table:
            msg = "at least one tier is needed (e.g. Tier('default', '100/minute'))"
            raise ConfigError(msg)
        if default is None:
            default = next(iter(table))
        self.tiers = table
        self.default = self.get(default, "the default tier")
        self._reported: set[str] = set()

    def get(self, name: str, what: str = "tier") -> Tier:
        """The tier called ``name``; a ConfigError naming the known ones if there is none."""
        tier = self.tiers.get(name)
        if tier is None:
            msg = f"unknown tier {name!r} ({what}); known tiers: {', '.join(self.tiers)}"
            raise ConfigError(msg)
        return tier

    def pick(self, name: str | None) -> Tier:
        """The tier a resolver named at run time; the default (logged once) if unknown."""
        if name is None:
            return self.default
        tier = self.tiers.get(name)
        if tier is not None:
            return tier
        shown = str(name)[:100]
        if len(self._reported) < 100 and shown not in self._reported:
            self._reported.add(shown)
            _log.error("ratelimit_mw: the tier resolver returned unknown tier %r; "
                       "using the default tier %r", shown, self.default.name)
        return self.default

    def check_names(self, names: Iterable[str], what: str) -> None:
        """Fail at start-up when configuration refers to a tier that does not exist."""
        for name in names:
            self.get(name, what)


class TierFromHeader:
    """The tier named by a request header, e.g. set by a trusted gateway.

    With ``trusted`` proxies, the header is believed only from them (a client that
    reaches the app another way gets the default tier); without, from every peer, so
    clients can pick their tier with it: use it so only behind a gateway that sets or
    strips the header. Values that are not in ``allowed`` (or unknown) get the default.
    """

    __slots__ = ("_name", "allowed", "header", "trusted")

    def __init__(self, header: object, *, allowed: Iterable[str] | None = None,
                 trusted: TrustedProxies | Iterable[str] | None = None) -> None:
        self.header = header_name(header, "the tier header")
        self._name = self.header.encode("latin-1")
        self.allowed = frozenset(allowed) if allowed is not None else None
        if trusted is not None and not isinstance(trusted, TrustedProxies):
            trusted = TrustedProxies(trusted)
        self.trusted = trusted if trusted else None

    def __call__(self, scope: Scope) -> str | None:
        if self.trusted is not None:
            client = scope.get("client")
            if not client or client[0] not in self.trusted:
                return None
        value = first_header_value(scope, self._name)
        if value is None:
            return None
        value = value.strip()
        if self.allowed is not None and value not in self.allowed:
            return None
        return value

    @property
    def tier_names(self) -> frozenset[str]:
        """The tiers this resolver can name (checked at start-up)."""
        return self.allowed or frozenset()


class TierByAPIKey:
    """The tier of the API key in ``header``: ``{"key-abc": "pro"}``; others get the default."""

    __slots__ = ("_keys", "_name", "header")

    def __init__(self, tiers: Mapping[str, str], header: object = "x-api-key") -> None:
        self._keys = dict(tiers)
        self.header = header_name(header, "the API key header")
        self._name = self.header.encode("latin-1")

    def __call__(self, scope: Scope) -> str | None:
        value = first_header_value(scope, self._name)
        if value is None:
            return None
        return self._keys.get(value.strip())

    @property
    def tier_names(self) -> frozenset[str]:
        """The tiers this resolver can name (checked at start-up)."""
        return frozenset(self._keys.values())

"""Who a request counts for: one answer for the limits, the quota endpoints and idempotency.

A key function takes the ASGI scope and returns the identity the limits count for
(``"ip:203.0.113.7"``, ``"apikey:…"``, ``"user:…"``), or ``None`` to leave the request
unlimited; it may be sync or async. ``Identity`` joins it with the tier resolver, and
falls back to the client IP (or the default tier) when either raises.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any, NamedTuple

from mypy_extensions import mypyc_attr
from starlette.types import Scope

from .asgi import first_header_value
from .callbacks import is_async_callable
from .checks import header_name
from .client_ip import ClientIP, TrustedProxies
from .errors import ConfigError
from .tiers import Tier, TierFromHeader, TierResolver, TierTable

if TYPE_CHECKING:
    from .settings import RateLimitSettings

__all__ = [
    "APIKey",
    "AuthenticatedUser",
    "Caller",
    "Identity",
    "KeyFunc",
    "credentials",
    "identity_from",
    "key_function",
]

KeyFunc = Callable[[Scope], "str | Awaitable[str | None] | None"]

_log = logging.getLogger("ratelimit_mw")


def _digest(value: str | bytes) -> str:
    """A short stable digest, so secrets never reach the storage or the logs."""
    data = value.encode("utf-8", "surrogateescape") if isinstance(value, str) else value
    return hashlib.blake2b(data, digest_size=16).hexdigest()


@mypyc_attr(allow_interpreted_subclasses=True)
class APIKey:
    """The API key sent in ``header`` (hashed; its first value, the one the app reads),
    else ``fallback`` (the client IP)."""

    __slots__ = ("_name", "fallback", "header")

    def __init__(self, header: object = "x-api-key", *, fallback: KeyFunc | None = None) -> None:
        self.header = header_name(header, "the API key header")
        self._name = self.header.encode("latin-1")
        self.fallback: KeyFunc = fallback if fallback is not None else ClientIP()
        if is_async_callable(self.fallback):
            msg = "APIKey's fallback must be a synchronous key function"
            raise ConfigError(msg)

    def __call__(self, scope: Scope) -> str | None:
        value = first_header_value(scope, self._name)
        if value is not None and value.strip():
            return f"apikey:{_digest(value.strip())}"
        return self.fallback(scope)  # type: ignore[return-value]

    def __repr__(self) -> str:
        return f"APIKey({self.header!r}, fallback={self.fallback!r})"


@mypyc_attr(allow_interpreted_subclasses=True)
class AuthenticatedUser:
    """The authenticated ``scope["user"]``'s identity, else ``fallback`` (the client IP).

    ``scope["user"]`` is set by Starlette's ``AuthenticationMiddleware``, which must
    therefore run before this middleware (be added after it).
    """

    __slots__ = ("fallback",)

    def __init__(self, *, fallback: KeyFunc | None = None) -> None:
        self.fallback: KeyFunc = fallback if fallback is not None else ClientIP()
        if is_async_callable(self.fallback):
            msg = "AuthenticatedUser's fallback must be a synchronous key function"
            raise ConfigError(msg)

    def __call__(self, scope: Scope) -> str | None:
        user: Any = scope.get("user")
        if user is not None and getattr(user, "is_authenticated", False):
            try:
                identity = user.identity
            except NotImplementedError:
                identity = user.display_name
            return f"user:{_digest(str(identity))}"
        return self.fallback(scope)  # type: ignore[return-value]

    def __repr__(self) -> str:
        return f"AuthenticatedUser(fallback={self.fallback!r})"


def key_function(key: str | KeyFunc, *, api_key_header: str, client_ip: ClientIP) -> KeyFunc:
    """The key function named ``ip``, ``api_key`` or ``user`` (each falling back to
    ``client_ip``), or ``key`` itself when it is one."""
    if not isinstance(key, str):
        if not callable(key):
            msg = f"key must be 'ip', 'api_key', 'user' or a callable, got {key!r}"
            raise TypeError(msg)
        return key
    if key == "ip":
        return client_ip
    if key == "api_key":
        return APIKey(api_key_header, fallback=client_ip)
    if key == "user":
        return AuthenticatedUser(fallback=client_ip)
    msg = f"unknown key {key!r}; expected 'ip', 'api_key', 'user' or a callable"
    raise ConfigError(msg)


def credentials(scope: Scope, api_key_header: bytes) -> str | None:
    """A digest of every credential the request carries: each value of its
    ``Authorization`` and ``api_key_header`` headers, else of its ``Cookie`` header;
    None when it carries none. Two requests that differ in any of them differ here."""
    sent = [name + b"\0" + value for name, value in scope["headers"]
            if name == b"authorization" or name == api_key_header]
    if not sent:
        sent = [b"cookie\0" + value for name, value in scope["headers"] if name == b"cookie"]
    if not sent:
        return None
    return "credentials:" + _digest(b"\0".join(sent))


class Caller(NamedTuple):
    """Who a request counts for: its key and its tier."""

    key: str
    tier: Tier

    @property
    def anonymous(self) -> bool:
        """True when the caller is known only by its client IP (no key, no user)."""
        return self.key.startswith("ip:")


@mypyc_attr(allow_interpreted_subclasses=True)
class Identity:
    """A request's key (by the key function) and tier (by the tier resolver).

    A key function that raises counts the request for its client IP, a resolver that
    raises gives the default tier: either is logged, never a 500. ``answers_now``: both
    are synchronous, so a request is identified without awaiting.
    """

    __slots__ = ("_failures", "_key", "_key_async", "_resolver", "_resolver_async",
                 "answers_now", "api_key_header", "client_ip", "tiers")

    def __init__(self, key: KeyFunc, tiers: TierTable, resolver: TierResolver | None,
                 client_ip: ClientIP, api_key_header: str = "x-api-key") -> None:
        self._key = key
        self._key_async = is_async_callable(key)
        self._resolver = resolver
        self._resolver_async = is_async_callable(resolver)
        self.answers_now = not self._key_async and not self._resolver_async
        self.tiers = tiers
        self.client_ip = client_ip
        self.api_key_header = api_key_header.encode("latin-1")
        """The header the API key comes in (``credentials`` reads it too)."""
        self._failures = _FailureLog()
        names = getattr(resolver, "tier_names", None)
        if names:
            tiers.check_names(names, "named by the tier resolver")

    def key_now(self, scope: Scope) -> str | None:
        """The (synchronous) key function's answer; the client IP if it raised."""
        try:
            key: Any = self._key(scope)
        except Exception as exc:
            self._failures.log("key function", self._key, exc)
            return self.client_ip(scope)
        return None if key is None else str(key)

    async def key_of(self, scope: Scope) -> str | None:
        """The key function's answer; the client IP if it raised."""
        if not self._key_async:
            return self.key_now(scope)
        try:
            pending: Any = self._key(scope)
            key = await pending
        except Exception as exc:
            self._failures.log("key function", self._key, exc)
            return self.client_ip(scope)
        return None if key is None else str(key)

    def tier_now(self, scope: Scope) -> Tier:
        """The tier the (synchronous) resolver names; the default tier if it raised."""
        if self._resolver is None:
            return self.tiers.default
        try:
            return self.tiers.pick(self._resolver(scope))  # type: ignore[arg-type]
        except Exception as exc:
            self._failures.log("tier resolver", self._resolver, exc)
            return self.tiers.default

    async def tier_of(self, scope: Scope) -> Tier:
        """The tier the resolver names; the default tier if it raised."""
        resolver = self._resolver
        if resolver is None or not self._resolver_async:
            return self.tier_now(scope)
        try:
            pending: Any = resolver(scope)
            return self.tiers.pick(await pending)
        except Exception as exc:
            self._failures.log("tier resolver", self._resolver, exc)
            return self.tiers.default

    async def caller(self, scope: Scope) -> Caller | None:
        """Who ``scope`` counts for (None: the key function leaves it unlimited)."""
        key = await self.key_of(scope)
        if key is None:
            return None
        return Caller(key, await self.tier_of(scope))


def identity_from(
    settings: RateLimitSettings, *, tiers: Iterable[Tier] | Mapping[str, Tier] | TierTable | None,
    key: str | KeyFunc | None, tier_resolver: TierResolver | None,
) -> Identity:
    """The identity ``RateLimitSettings`` describe, with the objects given in code
    (tiers, a key function, a tier resolver) taking the place of their settings."""
    if tiers is not None and settings.tiers:
        _log.warning("ratelimit_mw: the tiers given to the middleware replace those of "
                     "its settings (%s)", ", ".join(settings.tiers))
    if isinstance(tiers, TierTable):
        table = tiers
    elif tiers is not None:
        table = TierTable(tiers, settings.default_tier)
    else:
        table = settings.build_tiers()
    client_ip = ClientIP(TrustedProxies(settings.trusted_proxies),
                         ipv6_prefix=settings.ipv6_prefix,
                         forwarded_header=settings.forwarded_header)
    key_func = key_function(key if key is not None else settings.key,
                            api_key_header=settings.api_key_header, client_ip=client_ip)
    if tier_resolver is not None and settings.tier_header:
        _log.warning("ratelimit_mw: tier_header=%r is not read: the tier_resolver given "
                     "to the middleware picks the tier", settings.tier_header)
    if tier_resolver is None and settings.tier_header:
        trusted = client_ip.trusted
        tier_resolver = TierFromHeader(settings.tier_header, trusted=trusted)
        if not trusted:
            _log.warning(
                "ratelimit_mw: the tier is taken from the %s header of every client; "
                "any client can pick its own tier unless a gateway sets or strips it "
                "(set trusted_proxies to believe it only from your gateway)",
                settings.tier_header)
    return Identity(key_func, table, tier_resolver, client_ip, settings.api_key_header)


class _FailureLog:
    """Logs a failing key function or tier resolver without flooding the log: the
    first failure with its traceback, then at most one line a minute with a count."""

    __slots__ = ("_last", "_quiet")

    def __init__(self) -> None:
        self._last: dict[str, float] = {}
        self._quiet: dict[str, int] = {}

    def log(self, what: str, fn: object, exc: Exception) -> None:
        now = time.monotonic()
        last = self._last.get(what)
        if last is not None and now - last < 60:
            self._quiet[what] = self._quiet.get(what, 0) + 1
            return
        more = self._quiet.pop(what, 0)
        self._last[what] = now
        fallback = "the client IP" if what == "key function" else "the default tier"
        _log.error("ratelimit_mw: the %s %r raised %s: %s; using %s instead%s", what, fn,
                   type(exc).__name__, str(exc)[:200], fallback,
                   f" ({more} more such failures in the last minute)" if more else "",
                   exc_info=last is None)

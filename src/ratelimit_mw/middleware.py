"""The rate-limiting ASGI middleware.

``app.add_middleware(RateLimitMiddleware, tiers=[Tier("free", "100/minute")])``: every
HTTP request is keyed (client IP by default), given a tier and its route's limits,
and decided in one storage call; a 429 answers a denial, and rate-limit headers go
on every limited response.
"""

from __future__ import annotations

import inspect
import logging
import math
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .decision import Decision, Verdict
from .events import DecisionEvent, DecisionHook, Source, call_hook, log_denial
from .failure import Gate, StorageGuard
from .headers import HeaderFormat, retry_after_value
from .keys import APIKey, AuthenticatedUser, ClientIP, KeyFunc, TrustedProxies, is_async_callable
from .plans import Plan, check_plan, make_plan
from .responses import Denial, DeniedHook, denial_body, send_response, unavailable_body
from .routes import NO_ROUTE, RouteRule, RouteSpec, RouteTable
from .settings import RateLimitSettings
from .storage import MemoryStorage, RedisStorage, Storage, storage_from_url
from .tiers import Tier, TierFromHeader, TierResolver, TierTable

__all__ = ["RateLimitMiddleware"]

_log = logging.getLogger("ratelimit_mw")
Header = tuple[bytes, bytes]


class _Blocked:
    """A key known to be over its limit until ``until``: answered without the storage."""

    __slots__ = ("at", "outcome", "until", "verdict", "wait")

    def __init__(self, verdict: Verdict, at: float) -> None:
        self.verdict = verdict
        self.at = at
        self.until = at + verdict.retry_after
        self.wait = -1  # the Retry-After that ``outcome`` was rendered for
        self.outcome: _Outcome | None = None

    def now(self, now: float) -> Verdict:
        """The cached verdict with its times moved on to ``now``."""
        gone = now - self.at
        return Verdict(False, tuple(
            Decision(d.allowed, d.limit, d.remaining, max(0.0, d.reset_after - gone),
                     max(0.0, d.retry_after - gone), d.policy, d.scope)
            for d in self.verdict.decisions))


class _Outcome:
    """What the decision step hands back to ``__call__``."""

    __slots__ = ("headers", "key", "now", "plan", "refused", "response", "source", "verdict")

    def __init__(self, key: str, plan: Plan, verdict: Verdict | None, source: Source,
                 refused: bool, headers: list[Header], now: float) -> None:
        self.key = key
        self.plan = plan
        self.verdict = verdict
        self.source = source
        self.refused = refused
        self.headers = headers
        self.now = now
        # The rendered 429 (content type, body, headers), reused for a blocked key.
        self.response: tuple[bytes, bytes, list[Header]] | None = None


class RateLimitMiddleware:
    """Pure ASGI rate limiting for Starlette and FastAPI.

    ``settings`` (default: read from ``RATELIMIT_*`` variables) configures everything
    that can be written down; keyword ``options`` override its fields by name
    (``header_style="draft-11"``, ``failure_mode="memory"`` …). Objects go in as
    arguments: a ``storage`` (default: from ``storage_url``), ``tiers`` (default:
    from settings), a ``key`` function (``"ip"``, ``"api_key"``, ``"user"`` or a
    sync/async callable of the scope), a ``tier_resolver`` (sync/async callable of
    the scope returning a tier name), route ``rules``, an ``on_denied`` hook for a
    custom 429, an ``on_decision`` hook for metrics, a ``clock`` (epoch seconds) and
    a circuit ``breaker`` for the storage.
    """

    def __init__(
        self,
        app: ASGIApp,
        settings: RateLimitSettings | None = None,
        *,
        storage: Storage | None = None,
        tiers: Iterable[Tier] | Mapping[str, Tier] | TierTable | None = None,
        key: str | KeyFunc | None = None,
        tier_resolver: TierResolver | None = None,
        rules: Sequence[RouteRule] = (),
        on_denied: DeniedHook | None = None,
        on_decision: DecisionHook | None = None,
        clock: Callable[[], float] = time.time,
        breaker: Gate | None = None,
        **options: Any,
    ) -> None:
        if settings is None:
            settings = RateLimitSettings(**options)
        elif options:
            settings = RateLimitSettings.model_validate(
                {**settings.model_dump(exclude_unset=True), **options})
        self.app = app
        self.settings = settings
        self._clock = clock
        self._format = HeaderFormat(settings.header_style)
        self._response_format = settings.response_format
        self._shadow = settings.shadow
        self._websockets = settings.limit_websockets
        self._on_denied = on_denied
        self._on_denied_async = on_denied is not None and is_async_callable(on_denied)
        self._on_decision = on_decision

        if isinstance(tiers, TierTable):
            self._tiers = tiers
        elif tiers is not None:
            self._tiers = TierTable(tiers, settings.default_tier)
        else:
            self._tiers = settings.build_tiers()

        self._key = _key_function(key, settings)
        self._key_async = is_async_callable(self._key)
        if tier_resolver is None and settings.tier_header:
            tier_resolver = TierFromHeader(settings.tier_header)
        self._resolver = tier_resolver
        self._resolver_async = is_async_callable(tier_resolver)
        names = getattr(tier_resolver, "tier_names", None)
        if names:
            self._tiers.check_names(names, "named by the tier resolver")

        self._owns_storage = storage is None
        if storage is None:
            storage = _storage_from(settings, clock)
        self.storage = storage
        self._local = storage if isinstance(storage, MemoryStorage) else None
        self.guard = None if self._local is not None else StorageGuard(
            storage, mode=settings.failure_mode, timeout=settings.storage_timeout,
            recovery_interval=settings.recovery_interval, breaker=breaker, clock=clock)

        self._routes = RouteTable(app, [*settings.build_routes(), *rules], settings.exempt_paths)
        self._plans: dict[tuple[str, RouteSpec], Plan] = {}
        self._blocked: dict[tuple[str, Plan], _Blocked] = {}
        self._blocked_size = 0 if self._shadow else max(0, settings.blocked_cache_size)
        self._check_plans()

    def _check_plans(self) -> None:
        """Refuse to start when some request could never pass (e.g. cost > capacity)."""
        specs = [(NO_ROUTE, ""), *((spec, spec.label) for spec in self._routes.known_specs())]
        for tier in self._tiers.tiers.values():
            for spec, label in specs:
                if not spec.exempt:
                    check_plan(make_plan(tier, spec, self._format), label)

    def _plan(self, tier: Tier, route: RouteSpec) -> Plan:
        plan = self._plans.get((tier.name, route))
        if plan is None:
            if len(self._plans) >= 8192:
                self._plans.clear()
            plan = self._plans[(tier.name, route)] = make_plan(tier, route, self._format)
        return plan

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind != "http":
            if kind == "websocket" and self._websockets:
                await self._websocket(scope, receive, send)
            elif kind == "lifespan" and self._owns_storage:
                await self.app(scope, self._closing(receive), send)
            else:
                await self.app(scope, receive, send)
            return

        outcome = await self._decide(scope)
        if outcome is None:
            await self.app(scope, receive, send)
            return
        if outcome.refused:
            await self._refuse(scope, receive, send, outcome)
            return
        if not outcome.headers:
            await self.app(scope, receive, send)
            return
        await self.app(scope, receive, _adding(send, outcome.headers))

    async def _decide(self, scope: Scope) -> _Outcome | None:
        """Key, tier, route, one storage call; None when the request is not limited."""
        route = self._routes.resolve(scope)
        if route.exempt:
            return None
        key: Any = self._key(scope)
        if self._key_async:
            key = await key
        if key is None:
            return None
        key = str(key)
        if self._resolver is None:
            tier = self._tiers.default
        else:
            name: Any = self._resolver(scope)
            if self._resolver_async:
                name = await name
            tier = self._tiers.pick(name)
        plan = self._plan(tier, route)
        now = self._clock()

        source: Source = "storage"
        verdict: Verdict | None
        if self._blocked_size:
            blocked = self._blocked.get((key, plan))
            if blocked is not None:
                if now < blocked.until:
                    return self._from_blocked(key, plan, blocked, now)
                del self._blocked[(key, plan)]
        if self._local is not None:
            verdict = self._local.decide_now(key, plan.hits)
        else:
            verdict, source = await self.guard.decide(key, plan.hits)  # type: ignore[union-attr]
            if verdict is None:
                return self._finish(key, plan, None, source,
                                    self.guard.mode == "closed", now)  # type: ignore[union-attr]
        refused = not verdict.allowed
        if refused:
            if self._shadow:
                refused = False
            elif plan.shadow_only(verdict):
                verdict, source = await self._enforced_only(key, plan, verdict, source)
                refused = not verdict.allowed
            # Only the shared storage's denials are cached: a fallback's are local guesses.
            if (refused and self._blocked_size and source == "storage"
                    and math.isfinite(verdict.retry_after)):
                self._remember_blocked(key, plan, verdict, now)
        return self._finish(key, plan, verdict, source, refused, now)

    async def _enforced_only(
        self, key: str, plan: Plan, verdict: Verdict, source: Source,
    ) -> tuple[Verdict, Source]:
        """Only shadow limits denied: count the request on the enforced ones alone.

        A denial consumes nothing, so without this second call a request let through
        by a shadow limit would not count against the limits that do block.
        """
        if self._local is not None:
            enforced: Verdict | None = self._local.decide_now(key, plan.enforced)
        else:
            enforced, source = await self.guard.decide(key, plan.enforced)  # type: ignore[union-attr]
        shadow = plan.shadow
        shadowed = tuple(d for d in verdict.decisions if (d.scope, d.policy) in shadow)
        if enforced is None:
            return Verdict(True, verdict.decisions), source
        return Verdict(enforced.allowed, enforced.decisions + shadowed), source

    def _from_blocked(self, key: str, plan: Plan, blocked: _Blocked, now: float) -> _Outcome:
        """The answer for a key known to be over its limit, without the storage.

        The rendered 429 is reused while its Retry-After stays the same, so a client
        hammering away costs little more than a dict lookup.
        """
        wait = math.ceil(blocked.until - now)
        outcome = blocked.outcome
        if outcome is None or blocked.wait != wait or self._on_denied is not None:
            outcome = self._finish(key, plan, blocked.now(now), "blocked", True, now)
            blocked.outcome, blocked.wait = outcome, wait
            return outcome
        verdict = outcome.verdict
        assert verdict is not None  # a blocked outcome always holds its verdict
        log_denial(key, plan.tier.name, plan.route.label, verdict, shadow=False,
                   source="blocked")
        if self._on_decision is not None:
            call_hook(self._on_decision, DecisionEvent(
                key, plan.tier.name, plan.route.label, "blocked", verdict, True, False))
        return outcome

    def _remember_blocked(self, key: str, plan: Plan, verdict: Verdict, now: float) -> None:
        blocked = self._blocked
        if len(blocked) >= self._blocked_size:
            del blocked[next(iter(blocked))]
        blocked[(key, plan)] = _Blocked(verdict, now)

    def _finish(self, key: str, plan: Plan, verdict: Verdict | None, source: Source,
                refused: bool, now: float) -> _Outcome:
        """Headers, the denial log line and the metrics hook, for one decision."""
        headers: list[Header] = []
        if verdict is not None:
            if self._format:
                headers = [*plan.static_headers, *self._format.dynamic(verdict, plan.names, now)]
            if not verdict.allowed:
                log_denial(key, plan.tier.name, plan.route.label, verdict,
                           shadow=not refused, source=source)
        if self._on_decision is not None:
            shadow = verdict is not None and not verdict.allowed and not refused
            call_hook(self._on_decision, DecisionEvent(
                key, plan.tier.name, plan.route.label, source, verdict, refused, shadow))
        return _Outcome(key, plan, verdict, source, refused, headers, now)

    async def _refuse(self, scope: Scope, receive: Receive, send: Send, outcome: _Outcome) -> None:
        """A 429 for a denial, a 503 when the storage is down and the policy is closed."""
        verdict = outcome.verdict
        if verdict is None:
            retry = self.guard.retry_after if self.guard is not None else 1
            await send_response(send, 503, b"application/json", unavailable_body(retry),
                                [(b"retry-after", str(retry).encode())])
            return
        if outcome.response is not None:
            await send_response(send, 429, *outcome.response)
            return
        headers = list(outcome.headers)
        retry_after = retry_after_value(verdict.retry_after)
        if retry_after is not None:
            headers.append((b"retry-after", retry_after))
        binding = verdict.binding
        assert binding is not None  # a denial always has a denying decision
        plan = outcome.plan
        denial = Denial(outcome.key, plan.tier.name, plan.route.label, verdict, binding,
                        outcome.now, tuple(plan.names.get((d.scope, d.policy), d.policy.name)
                                           for d in verdict.decisions if not d.allowed))
        if self._on_denied is None:
            content_type, body = denial_body(denial, self._response_format)
            outcome.response = (content_type, body, headers)
            await send_response(send, 429, content_type, body, headers)
            return
        response: Any = self._on_denied(scope, denial)
        if self._on_denied_async or inspect.isawaitable(response):
            response = await response
        await response(scope, receive, _adding(send, headers))

    async def _websocket(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Opt-in: limit websocket connects; a refused one is closed with 1008."""
        outcome = await self._decide({**scope, "method": "WEBSOCKET"})
        if outcome is not None and outcome.refused:
            await send({"type": "websocket.close", "code": 1008, "reason": "rate limit exceeded"})
            return
        await self.app(scope, receive, send)

    def _closing(self, receive: Receive) -> Receive:
        """Close the storage we opened when the app shuts down."""
        async def wrapped() -> Message:
            message = await receive()
            if message["type"] == "lifespan.shutdown":
                await self.storage.close()
            return message

        return wrapped

    def __repr__(self) -> str:
        return (f"RateLimitMiddleware(storage={self.storage!r}, "
                f"tiers={list(self._tiers.tiers)!r}, header_style={self.settings.header_style!r})")


def _adding(send: Send, headers: list[Header]) -> Send:
    """``send`` that appends ``headers`` to the response start (bodies stream untouched)."""
    async def send_with_headers(message: Message) -> None:
        if message["type"] == "http.response.start":
            message["headers"] = [*message.get("headers", ()), *headers]
        await send(message)

    return send_with_headers


def _key_function(key: str | KeyFunc | None, settings: RateLimitSettings) -> KeyFunc:
    """The key function named in settings, or the one given."""
    if key is not None and not isinstance(key, str):
        if not callable(key):
            msg = f"key must be 'ip', 'api_key', 'user' or a callable, got {key!r}"
            raise TypeError(msg)
        return key
    name = key or settings.key
    ip = ClientIP(TrustedProxies(settings.trusted_proxies), ipv6_prefix=settings.ipv6_prefix)
    if name == "ip":
        return ip
    if name == "api_key":
        return APIKey(settings.api_key_header, fallback=ip)
    if name == "user":
        return AuthenticatedUser(fallback=ip)
    from .errors import ConfigError

    msg = f"unknown key {name!r}; expected 'ip', 'api_key', 'user' or a callable"
    raise ConfigError(msg)


def _storage_from(settings: RateLimitSettings, clock: Callable[[], float]) -> Storage:
    url = settings.storage_url
    if url.lower().startswith("memory://"):
        return MemoryStorage(clock=clock)
    storage = storage_from_url(url, prefix=settings.storage_prefix,
                               timeout=settings.storage_timeout)
    if isinstance(storage, RedisStorage):
        _log.debug("ratelimit_mw: deciding on %r", storage)
    return storage

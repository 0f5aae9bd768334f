"""The rate-limiting ASGI middleware.

``app.add_middleware(RateLimitMiddleware, tiers=[Tier("free", "100/minute")])``: every
HTTP request is keyed (client IP by default), given a tier and its route's limits,
and decided in one storage call; a 429 answers a denial, and rate-limit headers go
on every limited response.

A tier's ``concurrency`` takes a slot in that same call; the slot is given back just
before the last body chunk goes out (a streaming body holds it to its end, within its
lease), or when the app call ends otherwise (a client disconnect stops the response,
the app raises).

Downstream handlers find the middleware in ``scope["state"]["ratelimit"]``; its
``identify(scope)`` names the caller a request counts for (see ``ratelimit_mw.quota``).
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import math
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from functools import partial
from typing import Any, NamedTuple

from mypy_extensions import mypyc_attr
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .decision import Decision, Lease, Verdict
from .errors import ConfigError
from .events import DecisionEvent, DecisionHook, Source, call_hook, log_denial
from .failure import Gate, StorageGuard, describe_error
from .headers import HeaderFormat, retry_after_value
from .keys import APIKey, AuthenticatedUser, ClientIP, KeyFunc, TrustedProxies, is_async_callable
from .plans import Plan, check_plan, make_plan
from .policy import Limit
from .responses import Denial, DeniedHook, denial_body, send_response, unavailable_body
from .routes import NO_ROUTE, RouteRule, RouteSpec, RouteTable
from .settings import RateLimitSettings
from .storage import MemoryStorage, RedisStorage, Storage, storage_from_url
from .tiers import Tier, TierFromHeader, TierResolver, TierTable

__all__ = ["Caller", "RateLimitMiddleware"]

_log = logging.getLogger("ratelimit_mw")
Header = tuple[bytes, bytes]


class Caller(NamedTuple):
    """Who a request counts for, as the middleware resolved it: its key and tier."""

    key: str
    tier: Tier

    @property
    def anonymous(self) -> bool:
        """True when the caller is known only by its client IP (no key, no user)."""
        return self.key.startswith("ip:")


STATE_MIDDLEWARE = "ratelimit"


class _Blocked:
    """A key known to be over its limit until ``until``: answered without the storage."""

    __slots__ = ("at", "outcome", "response", "until", "verdict", "wait")

    def __init__(self, verdict: Verdict, at: float) -> None:
        self.verdict = verdict
        self.at = at
        self.until = at + verdict.retry_after
        self.wait = -1  # the Retry-After that ``outcome`` was rendered for
        self.outcome: _Outcome | None = None
        # The rendered 429 of ``outcome`` (content type, body, headers).
        self.response: tuple[bytes, bytes, list[Header]] | None = None

    def now(self, now: float) -> Verdict:
        """The cached verdict with its times moved on to ``now``."""
        gone = now - self.at
        at = self.verdict.at
        return Verdict(False, tuple(
            Decision(d.allowed, d.limit, d.remaining, max(0.0, d.reset_after - gone),
                     max(0.0, d.retry_after - gone), d.policy, d.scope)
            for d in self.verdict.decisions), (), None if at is None else at + gone)


class _Outcome:
    """What the decision step hands back to ``__call__``."""

    __slots__ = ("blocked", "headers", "key", "now", "plan", "refused", "source", "verdict")

    def __init__(self, key: str, plan: Plan, verdict: Verdict | None, source: Source,
                 refused: bool, headers: list[Header], now: float,
                 blocked: _Blocked | None = None) -> None:
        self.key = key
        self.plan = plan
        self.verdict = verdict
        self.source = source
        self.refused = refused
        self.headers = headers
        self.now = now
        # The cache entry a blocked key's answer came from (it keeps the rendered 429).
        self.blocked = blocked


@mypyc_attr(allow_interpreted_subclasses=True)
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
        _check_objects(settings=settings, storage=storage, tier_resolver=tier_resolver,
                       on_denied=on_denied, on_decision=on_decision, clock=clock,
                       breaker=breaker)
        if settings is None:
            settings = RateLimitSettings(**options)
        elif options:
            settings = RateLimitSettings.model_validate(
                {**settings.model_dump(exclude_unset=True), **options})
        self.app = app
        self.settings = settings
        self._clock = clock
        self._format = HeaderFormat(settings.header_style, partition_key=settings.partition_key)
        self._response_format = settings.response_format
        self._shadow = settings.shadow
        self._websockets = settings.limit_websockets
        self._on_denied = on_denied
        self._on_denied_async = on_denied is not None and is_async_callable(on_denied)
        self._on_decision = on_decision

        if tiers is not None and settings.tiers:
            _log.warning("ratelimit_mw: the tiers given to the middleware replace those of "
                         "its settings (%s)", ", ".join(settings.tiers))
        if isinstance(tiers, TierTable):
            self._tiers = tiers
        elif tiers is not None:
            self._tiers = TierTable(tiers, settings.default_tier)
        else:
            self._tiers = settings.build_tiers()

        # The client IP keys requests by default, and those whose key function raised
        # (their failure is logged, not a 500).
        self._client_ip = ClientIP(TrustedProxies(settings.trusted_proxies),
                                   ipv6_prefix=settings.ipv6_prefix,
                                   forwarded_header=settings.forwarded_header)
        self._key = _key_function(key, settings, self._client_ip)
        self._key_async = is_async_callable(self._key)
        self._failures = _Complaints()
        if tier_resolver is not None and settings.tier_header:
            _log.warning("ratelimit_mw: tier_header=%r is not read: the tier_resolver given "
                         "to the middleware picks the tier", settings.tier_header)
        if tier_resolver is None and settings.tier_header:
            trusted = self._client_ip.trusted
            tier_resolver = TierFromHeader(settings.tier_header, trusted=trusted)
            if not trusted:
                _log.warning(
                    "ratelimit_mw: the tier is taken from the %s header of every client; "
                    "any client can pick its own tier unless a gateway sets or strips it "
                    "(set trusted_proxies to believe it only from your gateway)",
                    settings.tier_header)
        self._resolver = tier_resolver
        self._resolver_async = is_async_callable(tier_resolver)
        names = getattr(tier_resolver, "tier_names", None)
        if names:
            self._tiers.check_names(names, "named by the tier resolver")

        self._owns_storage = storage is None
        if storage is None:
            storage = _storage_from(settings, clock)
        self.storage = storage
        # Memory storage is decided in place, without awaiting (a subclass that overrides
        # decide or release goes the way of any other storage, so its overrides run).
        self._local = storage if (
            isinstance(storage, MemoryStorage) and type(storage).decide is MemoryStorage.decide
            and type(storage).release is MemoryStorage.release) else None
        self.guard = None if self._local is not None else StorageGuard(
            storage, mode=settings.failure_mode, timeout=settings.storage_timeout,
            recovery_interval=settings.recovery_interval, breaker=breaker, clock=clock)

        # Memory storage with synchronous key and tier functions: decided without awaiting.
        self._sync = self._local is not None and not self._key_async and not self._resolver_async
        self._returns = _Returns(storage, max(1.0, settings.storage_timeout))
        self._watches = _Watches()
        # Pipelined Redis with a timeout of its own gives slots back without our help.
        self._gives_back = storage if (
            isinstance(storage, RedisStorage) and storage.pipeline
            and storage.timeout is not None
            and type(storage).release is RedisStorage.release) else None
        # The storage that gives slots back without being awaited, if any.
        self._frees_at_once: MemoryStorage | RedisStorage | None = (
            self._local if self._local is not None else self._gives_back)
        self._routes = RouteTable(app, [*settings.build_routes(), *rules], settings.exempt_paths)
        for pattern in self._routes.unreachable():
            _log.warning("ratelimit_mw: the route pattern %r matches no route of the app "
                         "(as its routes are when the middleware starts); its limits or "
                         "exemption never apply", pattern)
        # The table's own cache, read here first: RouteTable is interpreted code, and a
        # call into it costs more than the look-up.
        self._route_cache: dict[tuple[str, ...], RouteSpec] = self._routes.cache
        self._lease = settings.concurrency_lease
        self._renewals = _Renewals(self._lease, self._granted_by)
        self._usage = settings.quota_history
        self._plans: dict[tuple[str, RouteSpec], Plan] = {}
        self._late: set[tuple[str, str]] = set()  # (tier, route) found bad after start-up
        self._blocked: dict[tuple[str, Plan], _Blocked] = {}
        # The cache of blocked keys spares the shared storage a round trip; memory
        # storage answers just as fast, so it is not used there.
        self._blocked_size = 0 if self._shadow or self._local is not None else max(
            0, settings.blocked_cache_size)
        self._check_plans()

    def _check_plans(self) -> None:
        """Refuse to start when some request could never pass (e.g. cost > capacity)."""
        specs = [(NO_ROUTE, ""), *((spec, spec.label) for spec in self._routes.known_specs())]
        for tier in self._tiers.tiers.values():
            for spec, label in specs:
                if not spec.exempt:
                    check_plan(make_plan(tier, spec, self._format, self._lease), label)

    def _plan(self, tier: Tier, route: RouteSpec) -> Plan:
        plan = self._plans.get((tier.name, route))
        if plan is None:
            if len(self._plans) >= 8192:
                self._plans.clear()
            plan = self._plans[(tier.name, route)] = make_plan(
                tier, route, self._format, self._lease)
            self._check_late(plan)
        return plan

    def _check_late(self, plan: Plan) -> None:
        """The start-up check, for a route the app gained after start-up (its plan is
        made at its first request): logged once per tier and route, as there is no
        start-up left to fail (its requests are refused as never admissible)."""
        try:
            check_plan(plan, plan.route.label)
        except ConfigError as exc:
            seen = (plan.tier.name, plan.route.label)
            if seen not in self._late:
                self._late.add(seen)
                _log.error("ratelimit_mw: %s", exc)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self._not_http(scope, receive, send)
            return
        state = scope.get("state")
        if state is None:
            state = scope["state"] = {}
        state[STATE_MIDDLEWARE] = self
        outcome = self._decide_now(scope) if self._sync else await self._decide(scope)
        if outcome is None:
            await self.app(scope, receive, send)
            return
        if outcome.refused:
            await self._refuse(scope, receive, send, outcome)
            return
        verdict = outcome.verdict
        leases = verdict.leases if verdict is not None else ()
        if not leases:
            await self.app(scope, receive,
                           _Adding(send, outcome.headers) if outcome.headers else send)
            return
        renewals = self._renewals
        renewals.hold(leases, outcome.source)
        # Memory storage and pipelined Redis give slots back without awaiting: a plain
        # send wrapper does it, with no coroutine of its own.
        storage = self._frees_at_once
        if storage is None or outcome.source == "fallback":
            try:  # not a finally (see _holding_slots)
                await self._holding_slots(scope, receive, send, outcome.headers, leases,
                                          outcome.source)
            except BaseException as exc:
                renewals.drop(leases)
                raise exc
            renewals.drop(leases)
            return
        freeing = _Freeing(send, outcome.headers, leases, storage, scope["method"] == "HEAD")
        watch = _Watch(receive, freeing.free, self._watches)
        try:  # not a finally (see _holding_slots)
            await self.app(scope, watch, freeing)
        except BaseException as exc:
            watch.stop()
            freeing.free()
            renewals.drop(leases)
            raise exc
        watch.stop()
        freeing.free()
        renewals.drop(leases)

    def _granted_by(self, source: Source) -> Storage:
        """The storage whose slots a verdict from ``source`` holds."""
        if source == "fallback" and self.guard is not None and self.guard.fallback is not None:
            return self.guard.fallback
        return self.storage

    async def _not_http(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Websockets (limited only when asked to), lifespan, anything else: passed on."""
        kind = scope["type"]
        if kind == "websocket" and self._websockets:
            await self._websocket(scope, receive, send)
        elif kind == "lifespan" and self._owns_storage:
            await self.app(scope, self._closing(receive), send)
        else:
            await self.app(scope, receive, send)

    async def _holding_slots(self, scope: Scope, receive: Receive, send: Send,
                             headers: list[Header], leases: tuple[Lease, ...],
                             source: Source) -> None:
        """Run the app while the request holds its concurrency slots (and add ``headers``
        to its response).

        The slots go back just before the last body chunk is sent (a HEAD response's
        start, whose body is never sent), so a client that has seen the end of a
        response never finds its slot still taken by this worker (on pipelined Redis
        the ZREM is written then, ahead of every later decision, and not waited for);
        when the client disconnects (see `_Watch`); else when the app call ends (an
        exception, no body at all).
        """
        holding = _Holding(self, leases, source)
        head = scope["method"] == "HEAD"

        async def send_then_free(message: Message) -> None:
            kind = message["type"]
            if kind == "http.response.start":
                if headers:
                    message = _with_headers(message, headers)
                if head:
                    await holding.give_back()
            elif kind == "http.response.body" and not message.get("more_body"):
                await holding.give_back()
            await send(message)

        watch = _Watch(receive, holding.gone, self._watches)
        # Neither a finally nor a bare raise after an await: compiled with mypyc, both
        # would raise an exception that a failed give-back raised and handled meanwhile,
        # instead of the app's own.
        try:
            await self.app(scope, watch, send_then_free)
        except BaseException as exc:
            watch.stop()
            await holding.give_back()
            raise exc
        watch.stop()
        await holding.give_back()

    async def identify(self, scope: Scope) -> Caller | None:
        """The caller a request counts for (None: not limited), by the same key function
        and tier resolver the middleware uses; also for routes it does not limit."""
        key = await self._key_of(scope)
        if key is None:
            return None
        return Caller(str(key), await self._tier_of(scope))

    def _key_now(self, scope: Scope) -> Any:
        """The (synchronous) key function's answer; the client IP if it raised."""
        try:
            return self._key(scope)
        except Exception as exc:
            self._failures.log("key function", self._key, exc)
            return self._client_ip(scope)

    async def _key_of(self, scope: Scope) -> Any:
        """The key function's answer; the client IP if it raised."""
        try:
            key: Any = self._key(scope)
            return await key if self._key_async else key
        except Exception as exc:
            self._failures.log("key function", self._key, exc)
            return self._client_ip(scope)

    def _tier_now(self, scope: Scope) -> Tier:
        """The tier the (synchronous) resolver names; the default tier if it raised."""
        if self._resolver is None:
            return self._tiers.default
        try:
            return self._tiers.pick(self._resolver(scope))  # type: ignore[arg-type]
        except Exception as exc:
            self._failures.log("tier resolver", self._resolver, exc)
            return self._tiers.default

    async def _tier_of(self, scope: Scope) -> Tier:
        """The tier the resolver names; the default tier if it raised."""
        if self._resolver is None:
            return self._tiers.default
        try:
            name: Any = self._resolver(scope)
            if self._resolver_async:
                name = await name
            return self._tiers.pick(name)
        except Exception as exc:
            self._failures.log("tier resolver", self._resolver, exc)
            return self._tiers.default

    @property
    def clock(self) -> Callable[[], float]:
        """The wall clock (epoch seconds) the middleware reports times on."""
        return self._clock

    @property
    def tiers(self) -> TierTable:
        """The tiers this middleware knows."""
        return self._tiers

    def plan_for(self, tier: Tier) -> Plan:
        """The plan of ``tier`` on a route without limits of its own (for quota reports)."""
        return self._plan(tier, NO_ROUTE)

    async def _give_back(self, leases: tuple[Lease, ...], source: Source) -> None:
        """Return the request's concurrency slots to the storage that granted them.

        Never raises: a slot that can't be given back expires with its lease. A
        cancelled request can't cut the release off: pipelined Redis writes its ZREMs
        at once, without waiting for the answer (they are on their way before the end
        of the response, ahead of every later decision of this worker, and a failure is
        logged when it comes); any other storage releases in a task of its own (shared
        by the requests ending in the same event-loop iteration).
        """
        if self._local is not None:
            self._local.release_now(leases)
            return
        if source == "fallback" and self.guard is not None and self.guard.fallback is not None:
            await self.guard.fallback.release(leases)
            return
        if self._gives_back is not None:
            # Not awaited: waiting for Redis's answer cost a second wake-up of the
            # request's whole await chain, a fifth of its CPU time under load.
            self._gives_back.give_back(leases).add_done_callback(
                partial(_gave_back, len(leases)))
            return
        task = asyncio.current_task()
        cancelling = task is not None and task.cancelling()
        try:
            done = self._returns.submit(leases)
            if cancelling:
                return  # the release goes on without us
            await asyncio.shield(done)
        except Exception as exc:
            _could_not_give_back(len(leases), exc)

    def _route(self, scope: Scope) -> RouteSpec:
        """The spec of this request's route."""
        spec = self._route_cache.get((scope["method"], scope["path"]))
        return spec if spec is not None else self._routes.resolve(scope)

    def _decide_now(self, scope: Scope) -> _Outcome | None:
        """``_decide`` on memory storage with synchronous key and tier functions."""
        route = self._route(scope)
        if route.exempt:
            return None
        key = self._key_now(scope)
        if key is None:
            return None
        return self._decide_local(str(key), self._plan(self._tier_now(scope), route))

    async def _decide(self, scope: Scope) -> _Outcome | None:
        """Key, tier, route, one storage call; None when the request is not limited."""
        route = self._route(scope)
        if route.exempt:
            return None
        key = await self._key_of(scope) if self._key_async else self._key_now(scope)
        if key is None:
            return None
        key = str(key)
        tier = await self._tier_of(scope) if self._resolver_async else self._tier_now(scope)
        plan = self._plan(tier, route)
        if self._local is not None:
            return self._decide_local(key, plan)

        now = self._clock()
        if self._blocked_size:
            blocked = self._blocked.get((key, plan))
            if blocked is not None:
                if now < blocked.until:
                    return self._from_blocked(key, plan, blocked, now)
                del self._blocked[(key, plan)]
        guard: StorageGuard = self.guard  # type: ignore[assignment]
        usage = self._usage and plan.route.cost
        verdict, source = await guard.decide(key, plan.hits, usage=usage)
        # Closed: nothing is admitted undecided; but shadow mode never refuses.
        closed = guard.mode == "closed" and not self._shadow
        if verdict is None:
            return self._finish(key, plan, None, source, closed, now)
        if not verdict.allowed and plan.shadow_only(verdict):
            # A denial consumes nothing: without a second call, a request let through by
            # a shadow limit would not count against the limits that do block.
            enforced, source = await guard.decide(key, plan.enforced, usage=usage)
            if enforced is None and closed:
                return self._finish(key, plan, None, source, True, now)
            verdict = _with_shadowed(plan, verdict, enforced)
        seen = verdict  # for the metrics hook, shadow denials included
        verdict, refused = self._as_told(plan, verdict)
        # Only the shared storage's denials are cached: a fallback's are local guesses.
        # A full concurrency slot may free any moment: never cached.
        if (refused and self._blocked_size and source == "storage"
                and math.isfinite(verdict.retry_after)
                and not (plan.concurrent and _slot_denied(verdict))):
            # From the clock after the answer: the wait began at most then, and a
            # Retry-After counted from before the round trip would point too early.
            self._remember_blocked(key, plan, verdict, self._clock())
        return self._finish(key, plan, verdict, source, refused, now, seen=seen)

    def _decide_local(self, key: str, plan: Plan) -> _Outcome:
        """The decision on memory storage, which never awaits."""
        local: MemoryStorage = self._local  # type: ignore[assignment]
        usage = self._usage and plan.route.cost
        verdict = local.decide_now(key, plan.hits, usage=usage)
        if not verdict.allowed and plan.shadow_only(verdict):
            verdict = _with_shadowed(
                plan, verdict, local.decide_now(key, plan.enforced, usage=usage))
        seen = verdict
        verdict, refused = self._as_told(plan, verdict)
        return self._finish(key, plan, verdict, "storage", refused,
                            verdict.at, seen=seen)  # type: ignore[arg-type]

    def _as_told(self, plan: Plan, verdict: Verdict) -> tuple[Verdict, bool]:
        """The verdict as the client is told it, and whether the request is refused (a
        real denial reports only what the enforced limits say)."""
        refused = not verdict.allowed and not self._shadow
        if refused and plan.shadow:
            return _enforced_denial(plan, verdict), True
        return verdict, refused

    def _from_blocked(self, key: str, plan: Plan, blocked: _Blocked, now: float) -> _Outcome:
        """The answer for a key known to be over its limit, without the storage.

        The rendered 429 is reused while its Retry-After stays the same, so a client
        hammering away costs little more than a dict lookup.
        """
        wait = math.ceil(blocked.until - now)
        outcome = blocked.outcome
        if outcome is None or blocked.wait != wait or self._on_denied is not None:
            outcome = self._finish(key, plan, blocked.now(now), "blocked", True, now, blocked)
            blocked.outcome, blocked.wait, blocked.response = outcome, wait, None
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
                refused: bool, now: float, blocked: _Blocked | None = None, *,
                seen: Verdict | None = None) -> _Outcome:
        """Headers, the denial log line and the metrics hook, for one decision.

        ``seen``: the verdict as decided, for the metrics hook, when ``verdict`` is what
        the client is told and the log says (a real denial, without the shadow limits'
        say).
        """
        if seen is None:
            seen = verdict
        headers: list[Header] = []
        if verdict is not None:
            if verdict.at is not None:
                # Epoch times (X-RateLimit-Reset, reset_at) on the storage's clock: with
                # Redis, the server's, so app servers with skewed clocks report the same.
                now = verdict.at
            if self._format:
                headers = self._format.dynamic(verdict, plan.names, now, key)
                if plan.static_headers:
                    headers = [*plan.static_headers, *headers]
            if not verdict.allowed:
                log_denial(key, plan.tier.name, plan.route.label, verdict,
                           shadow=not refused, source=source)
            elif plan.shadow and not all(d.allowed for d in verdict.decisions):
                # Only shadow limits denied: a shadow denial, logged, let through.
                log_denial(key, plan.tier.name, plan.route.label, Verdict(False, tuple(
                    d for d in verdict.decisions if not d.allowed)), shadow=True, source=source)
        if self._on_decision is not None:
            # A shadow denial: a limit denied (global shadow mode, or a shadow limit of
            # its own) and the request goes through.
            shadow = (not refused and seen is not None
                      and not all(d.allowed for d in seen.decisions))
            call_hook(self._on_decision, DecisionEvent(
                key, plan.tier.name, plan.route.label, source, seen, refused, shadow))
        return _Outcome(key, plan, verdict, source, refused, headers, now, blocked)

    async def _refuse(self, scope: Scope, receive: Receive, send: Send, outcome: _Outcome) -> None:
        """A 429 for a denial, a 503 when the storage is down and the policy is closed."""
        verdict = outcome.verdict
        if verdict is None:
            retry = self.guard.retry_after if self.guard is not None else 1
            await send_response(send, 503, b"application/json", unavailable_body(retry),
                                [(b"retry-after", str(retry).encode())])
            return
        blocked = outcome.blocked
        if blocked is not None and blocked.response is not None:
            await send_response(send, 429, *blocked.response)
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
            if blocked is not None:
                blocked.response = (content_type, body, headers)
            await send_response(send, 429, content_type, body, headers)
            return
        response: Any = self._on_denied(scope, denial)
        if self._on_denied_async or inspect.isawaitable(response):
            response = await response
        await response(scope, receive, _Completing(send, headers))

    async def _websocket(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Opt-in: limit websocket connects. A refused one gets the 429 (headers and
        body) where the server offers the ASGI websocket denial response; elsewhere it
        is closed with 1008 before the handshake (clients see a 403)."""
        state = scope.get("state")
        if state is None:
            state = scope["state"] = {}
        state[STATE_MIDDLEWARE] = self
        outcome = await self._decide({**scope, "method": "WEBSOCKET"})
        if outcome is not None and outcome.refused:
            if "websocket.http.response" in (scope.get("extensions") or {}):
                await self._refuse(scope, receive, _websocket_response(send), outcome)
            else:
                await send({"type": "websocket.close", "code": 1008,
                            "reason": "rate limit exceeded"})
            return
        verdict = outcome.verdict if outcome is not None else None
        if outcome is not None and outcome.headers:
            send = _Adding(send, outcome.headers)  # on the accept (or the app's own denial)
        if verdict is None or not verdict.leases:
            await self.app(scope, receive, send)
            return
        # A websocket holds its slot while it is connected, its lease renewed meanwhile
        # (no finally: see _holding_slots).
        source: Source = outcome.source  # type: ignore[union-attr]
        self._renewals.hold(verdict.leases, source)
        try:
            await self.app(scope, receive, send)
        except BaseException as exc:
            self._renewals.drop(verdict.leases)
            await self._give_back(verdict.leases, source)
            raise exc
        self._renewals.drop(verdict.leases)
        await self._give_back(verdict.leases, source)

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


class _Returns:
    """Gives back the slots of the requests that end in one event-loop iteration
    together, in one ``release`` call bounded by a timeout (on Redis, the storage sends
    them in the pipeline of that iteration's decisions)."""

    __slots__ = ("_batch", "_done", "_storage", "_tasks", "_timeout")

    def __init__(self, storage: Storage, timeout: float) -> None:
        self._storage = storage
        self._timeout = timeout
        self._batch: list[Lease] = []
        self._done: asyncio.Future[None] | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    def submit(self, leases: tuple[Lease, ...]) -> asyncio.Future[None]:
        """Queue ``leases``; the future resolves once they are back (or failed to be)."""
        done = self._done
        if done is None:
            loop = asyncio.get_running_loop()
            done = self._done = loop.create_future()
            done.add_done_callback(_retrieve)
            # The task starts on the next iteration: requests ending meanwhile join it.
            task = loop.create_task(self._run(done))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        self._batch.extend(leases)
        return done

    async def _run(self, done: asyncio.Future[None]) -> None:
        batch, self._batch, self._done = self._batch, [], None
        try:
            async with asyncio.timeout(self._timeout):
                await self._storage.release(batch)
        except Exception as exc:
            done.set_exception(exc)
        else:
            done.set_result(None)


class _Renewals:
    """The concurrency slots this worker's requests hold, renewed every third of a lease
    while they are held, so a slot lasts as long as its request however long it runs
    (a stream, a websocket); a worker that died renews nothing, and its slots end
    within a lease.

    A timer per event loop, armed while a slot is held on that loop, starts each round
    of renewals of that loop's slots as tasks of their own (nothing waits on the loop
    in between, and a round that hangs can't hold up the next)."""

    __slots__ = ("_armed", "_granted_by", "_held", "_lease_us", "_rounds", "_tick")

    def __init__(self, lease: float, granted_by: Callable[[Source], Storage]) -> None:
        self._held: dict[int, tuple[tuple[Lease, ...], Source, asyncio.AbstractEventLoop]] = {}
        self._granted_by = granted_by  # the storage of a verdict's source, found per tick
        self._lease_us = Limit.concurrency(1, lease=lease).period_us
        self._tick = lease / 3
        self._armed: set[asyncio.AbstractEventLoop] = set()
        self._rounds: set[asyncio.Task[None]] = set()

    def hold(self, leases: tuple[Lease, ...], source: Source) -> None:
        """``leases``, granted by the storage of ``source``, are held from now (until
        ``drop``)."""
        loop = asyncio.get_running_loop()
        self._held[id(leases)] = (leases, source, loop)
        if loop not in self._armed:
            # Loops closed with a timer still set (a test client's) are forgotten here.
            self._armed = {armed for armed in self._armed if not armed.is_closed()}
            self._armed.add(loop)
            loop.call_later(self._tick, self._due, loop)

    def drop(self, leases: tuple[Lease, ...]) -> None:
        """``leases`` are given back (or about to be): no more renewing."""
        self._held.pop(id(leases), None)

    def _due(self, loop: asyncio.AbstractEventLoop) -> None:
        """A tick on ``loop``: renew every slot held on it now (a slot is renewed at most
        a third of a lease after it was taken, and twice more before its lease would
        end), and arm the next tick while any is held."""
        due: dict[int, tuple[Storage, list[Lease]]] = {}
        for leases, source, on in self._held.values():
            if on is loop:
                storage = self._granted_by(source)
                due.setdefault(id(storage), (storage, []))[1].extend(leases)
        if not due:
            self._armed.discard(loop)
            return
        # Each storage on its own, within a tick: a Redis that hangs must not hold up
        # the renewals of the memory fallback taking its place.
        for storage, renewing in due.values():
            task = loop.create_task(self._renew(storage, renewing),
                                    name="ratelimit_mw lease renewals")
            self._rounds.add(task)
            task.add_done_callback(self._rounds.discard)
        loop.call_later(self._tick, self._due, loop)

    async def _renew(self, storage: Storage, leases: list[Lease]) -> None:
        try:
            async with asyncio.timeout(self._tick):
                await storage.renew(leases, self._lease_us)
        except Exception as exc:
            _log.warning("ratelimit_mw: couldn't renew %d concurrency slot(s) (%s); they "
                         "end with their lease unless renewed later", len(leases),
                         describe_error(exc))


def _gave_back(count: int, future: asyncio.Future[Any]) -> None:
    """Log a give-back that failed after its request went on without waiting."""
    if future.cancelled():
        return
    exc = future.exception()
    if exc is not None:
        _could_not_give_back(count, exc)


def _could_not_give_back(count: int, exc: BaseException) -> None:
    _log.warning("ratelimit_mw: couldn't give back %d concurrency slot(s) (%s: %s); "
                 "they free themselves when their lease ends", count,
                 type(exc).__name__, str(exc)[:200])


def _retrieve(future: asyncio.Future[None]) -> None:
    """Mark a batch's error as seen (its waiters may all have been cancelled)."""
    if not future.cancelled():
        future.exception()


def _with_shadowed(plan: Plan, verdict: Verdict, enforced: Verdict | None) -> Verdict:
    """The verdict of the enforced limits alone, with the shadow limits' decisions from
    ``verdict`` (which only they denied) put back in the plan's order."""
    if enforced is None:  # the storage failed on the second call: let it through
        return Verdict(True, verdict.decisions)
    shadow = plan.shadow
    counted = iter(enforced.decisions)
    return Verdict(enforced.allowed, tuple(
        d if (d.scope, d.policy) in shadow else next(counted) for d in verdict.decisions),
        enforced.leases, enforced.at)


def _enforced_denial(plan: Plan, verdict: Verdict) -> Verdict:
    """A refused verdict as its enforced limits see it: a shadow limit that also denied
    sets neither Retry-After, nor the reported policy, nor how long the key stays
    cached as blocked (it is reported as admitting, with what it has left)."""
    shadow = plan.shadow
    return verdict._replace(decisions=tuple(
        d._replace(allowed=True, retry_after=0.0)
        if not d.allowed and (d.scope, d.policy) in shadow else d
        for d in verdict.decisions))


def _slot_denied(verdict: Verdict) -> bool:
    """True when a concurrency slot is among what denied ``verdict``."""
    return any(not d.allowed and d.policy.is_concurrency for d in verdict.decisions)


def _websocket_response(send: Send) -> Send:
    """``send`` for an HTTP response that denies a websocket handshake."""
    async def send_as_denial(message: Message) -> None:
        kind = message["type"]
        if kind.startswith("http.response."):  # a Starlette response already says websocket.
            message = {**message, "type": f"websocket.{kind}"}
        await send(message)

    return send_as_denial


class _Complaints:
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


_RESPONSE_STARTS = frozenset(("http.response.start", "websocket.http.response.start",
                              "websocket.accept"))


_OURS = frozenset((
    b"x-ratelimit-limit", b"x-ratelimit-remaining", b"x-ratelimit-reset", b"x-ratelimit-policy",
    b"ratelimit", b"ratelimit-policy", b"ratelimit-limit", b"ratelimit-remaining",
    b"ratelimit-reset", b"retry-after"))
"""Every header name the middleware may add to a response."""
_OUR_INITIALS = frozenset(b"xXrR")
"""Their first letters, either case, as the ints a name's first byte reads as."""


def _with_headers(message: Message, headers: list[Header]) -> Message:
    """A copy of the response start ``message`` with ``headers`` added, but for those
    the app set itself (its own win: never two of one name, which clients can't read).
    A copy: whoever sent the message may keep it (as a record of the response)."""
    own = message.get("headers", ())
    for name, _ in own:
        # The first letter first: most names go by without a lower-cased copy or a hash.
        if name and name[0] in _OUR_INITIALS and name.lower() in _OURS:
            names = {name.lower() for name, _ in own}
            headers = [header for header in headers if header[0] not in names]
            break
    return {**message, "headers": [*own, *headers]}


class _Adding:
    """``send`` that appends ``headers`` to the response start (bodies stream untouched).

    A plain callable returning ``send``'s own awaitable: a coroutine of its own would
    add an object and a layer of awaiting to every message.
    """

    __slots__ = ("headers", "send")

    def __init__(self, send: Send, headers: list[Header]) -> None:
        self.send = send
        self.headers = headers

    def __call__(self, message: Message) -> Awaitable[None]:
        if message["type"] in _RESPONSE_STARTS:
            message = _with_headers(message, self.headers)
        return self.send(message)


class _Completing(_Adding):
    """``send`` for a custom denial response (``on_denied``): adds the rate-limit headers
    and ``Retry-After`` that the response does not set itself (its own win, so never two
    of one), and ``Cache-Control: no-store`` to a 429 that says nothing about caching."""

    __slots__ = ()

    def __call__(self, message: Message) -> Awaitable[None]:
        if message["type"] in _RESPONSE_STARTS:
            added = self.headers
            if message.get("status") == 429 and all(
                    name.lower() != b"cache-control" for name, _ in message.get("headers", ())):
                added = [*added, (b"cache-control", b"no-store")]
            message = _with_headers(message, added)
        return self.send(message)


class _Freeing:
    """``send`` for a request holding concurrency slots on memory storage or pipelined
    Redis: appends ``headers`` to the response start, and gives the slots back just
    before the last body chunk, or for a HEAD request (whose body is never sent) the
    start (``free``: at once, without waiting for Redis; then never again), so a
    background task that runs after the response does not hold them.

    A plain callable returning ``send``'s own awaitable, like ``_Adding``.
    """

    __slots__ = ("head", "headers", "held", "leases", "send", "storage")

    def __init__(self, send: Send, headers: list[Header], leases: tuple[Lease, ...],
                 storage: MemoryStorage | RedisStorage, head: bool) -> None:
        self.send = send
        self.headers = headers
        self.leases = leases
        self.storage = storage
        self.head = head
        self.held = True

    def __call__(self, message: Message) -> Awaitable[None]:
        kind = message["type"]
        if kind == "http.response.start":
            if self.headers:
                message = _with_headers(message, self.headers)
            if self.head:
                self.free()
        elif self.held and kind == "http.response.body" and not message.get("more_body"):
            self.free()
        return self.send(message)

    def free(self) -> None:
        """Give the slots back, once; never raises (a failure is logged, and the slots
        free themselves when their lease ends)."""
        if not self.held:
            return
        self.held = False
        leases = self.leases
        storage = self.storage
        try:
            if isinstance(storage, MemoryStorage):
                storage.release_now(leases)
                return
            # Not awaited: waiting for Redis's answer cost a second wake-up of the
            # request's whole await chain, a fifth of its CPU time under load.
            storage.give_back(leases).add_done_callback(partial(_gave_back, len(leases)))
        except Exception as exc:
            _could_not_give_back(len(leases), exc)


class _Holding:
    """The slots of a request on a storage whose give-back is awaited: given back once."""

    __slots__ = ("held", "leases", "middleware", "source")

    def __init__(self, middleware: RateLimitMiddleware, leases: tuple[Lease, ...],
                 source: Source) -> None:
        self.middleware = middleware
        self.leases = leases
        self.source = source
        self.held = True

    async def give_back(self) -> None:
        if self.held:
            self.held = False
            await self.middleware._give_back(self.leases, self.source)

    def gone(self) -> None:
        """The client disconnected: give the slots back in a task of their own."""
        if self.held:
            _background(self.give_back())


_WATCH_AFTER = 1.0
"""Seconds (at most) a request holding slots runs before a task watches for its client
leaving."""

_TASKS: set[asyncio.Task[None]] = set()  # running background tasks (held, not collected)


def _background(work: Awaitable[None]) -> None:
    task: asyncio.Task[None] = asyncio.ensure_future(work)
    _TASKS.add(task)
    task.add_done_callback(_TASKS.discard)


class _Watches:
    """The requests holding slots now, and one timer for them all: every `_WATCH_AFTER`
    seconds (while there are some), those still running get their watching task. One
    timer a second, not one per request."""

    __slots__ = ("_loop", "_running", "_timer")

    def __init__(self) -> None:
        self._running: dict[int, _Watch] = {}
        self._timer: asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def add(self, watch: _Watch) -> None:
        self._running[id(watch)] = watch
        if self._timer is None:
            loop = self._loop = asyncio.get_running_loop()
            self._timer = loop.call_later(_WATCH_AFTER, self._due)

    def discard(self, watch: _Watch) -> None:
        self._running.pop(id(watch), None)

    def _due(self) -> None:
        self._timer = None
        running = list(self._running.values())
        self._running.clear()
        for watch in running:
            watch.start()


class _Watch:
    """``receive`` for a request holding concurrency slots: ``gone`` is called when the
    client disconnects, so the slots go back though the app runs on.

    The app's own ``receive`` calls tell; a request still running after (at most)
    `_WATCH_AFTER` seconds (a handler that never reads would not tell) gets a task that
    reads for it, a message at a time, each handed over when the app asks. While the
    app waits on ``receive`` itself, the task starts only once that call returns: two
    readers at once could take a message from each other.
    """

    __slots__ = ("_due", "_gone", "_inbox", "_last", "_reading", "_receive", "_task",
                 "_watches")

    def __init__(self, receive: Receive, gone: Callable[[], None], watches: _Watches) -> None:
        self._receive = receive
        self._gone = gone
        self._reading = False  # the app is in receive() itself
        self._due = False  # the task is due, once the app's call returns
        self._task: asyncio.Task[None] | None = None
        self._inbox: asyncio.Queue[Message | Exception] | None = None  # the task's, for the app
        self._last: Message | Exception | None = None  # the disconnect (or error) it ended on
        self._watches = watches
        watches.add(self)

    async def __call__(self) -> Message:
        inbox = self._inbox
        if inbox is not None:
            last = self._last if inbox.empty() and self._last is not None else await inbox.get()
            if isinstance(last, Exception):
                raise last
            return last
        self._reading = True
        try:  # not a finally (see _holding_slots)
            message = await self._receive()
        except BaseException as exc:
            self._reading = False
            raise exc
        self._reading = False
        if message["type"] == "http.disconnect":
            self._due = False
            self._gone()
        elif self._due:
            self.start()
        return message

    def start(self) -> None:
        """Start the watching task (once the app's own receive call returns, if any)."""
        if self._reading:
            self._due = True
        elif self._task is None:
            self._due = False
            self._inbox = asyncio.Queue(1)
            self._task = asyncio.ensure_future(self._read(self._inbox))

    async def _read(self, inbox: asyncio.Queue[Message | Exception]) -> None:
        last: Message | Exception
        try:
            while True:
                message = await self._receive()
                if message["type"] == "http.disconnect":
                    last = message
                    self._gone()
                    break
                await inbox.put(message)
        except Exception as exc:  # the app gets it, as if it had called receive
            last = exc
        # Every later call gets it too; one waiting now is woken with it.
        self._last = last
        if inbox.empty():
            inbox.put_nowait(last)

    def stop(self) -> None:
        """The app call ended: no task any more."""
        self._watches.discard(self)
        if self._task is not None:
            self._task.cancel()


def _check_objects(*, settings: object, storage: object, breaker: object,
                   **callables: object) -> None:
    """A TypeError naming any argument given as an object that can't do its job (it
    would otherwise fail on the first request, or never)."""
    if settings is not None and not isinstance(settings, RateLimitSettings):
        msg = f"settings must be a RateLimitSettings, got {settings!r}"
        raise TypeError(msg)
    if storage is not None and not callable(getattr(storage, "decide", None)):
        msg = f"storage must be a ratelimit_mw Storage (e.g. MemoryStorage()), got {storage!r}"
        raise TypeError(msg)
    if breaker is not None and not callable(getattr(breaker, "try_acquire", None)):
        msg = f"breaker must be a circuit breaker (e.g. CircuitBreaker()), got {breaker!r}"
        raise TypeError(msg)
    for name, value in callables.items():
        if value is not None and not callable(value):
            msg = f"{name} must be a callable, got {value!r}"
            raise TypeError(msg)
    on_decision = callables.get("on_decision")
    if on_decision is not None and is_async_callable(on_decision):
        # It would never be awaited: no metrics, and a warning per request.
        msg = (f"on_decision must be a plain (not async) function, got {on_decision!r}: it "
               f"runs on every decision; hand slow work to a queue or a task of your own")
        raise TypeError(msg)


def _key_function(key: str | KeyFunc | None, settings: RateLimitSettings,
                  ip: ClientIP) -> KeyFunc:
    """The key function named in settings (``ip``, or falling back to it), or the one
    given."""
    if key is not None and not isinstance(key, str):
        if not callable(key):
            msg = f"key must be 'ip', 'api_key', 'user' or a callable, got {key!r}"
            raise TypeError(msg)
        return key
    name = key or settings.key
    if name == "ip":
        return ip
    if name == "api_key":
        return APIKey(settings.api_key_header, fallback=ip)
    if name == "user":
        return AuthenticatedUser(fallback=ip)
    msg = f"unknown key {name!r}; expected 'ip', 'api_key', 'user' or a callable"
    raise ConfigError(msg)


def _storage_from(settings: RateLimitSettings, clock: Callable[[], float]) -> Storage:
    url = settings.storage_url
    retention = settings.usage_retention
    if url.lower().startswith("memory://"):
        return storage_from_url(url, clock=clock, usage_retention=retention)
    storage = storage_from_url(url, prefix=settings.storage_prefix,
                               timeout=settings.storage_timeout, usage_retention=retention)
    if isinstance(storage, RedisStorage):
        _log.debug("ratelimit_mw: deciding on %r", storage)
    return storage

"""Deciding a request: who it counts for, which limits apply, and what the storage says.

``Limiter`` knows nothing of ASGI messages. From a request's scope it finds the caller
(``Identity``) and the route's spec, takes the limit set of the caller's tier on
that route, and decides every limit of the set in one storage call under the failure
policy, with shadow limits and the cache of blocked keys; it hands back an
``Outcome`` (the verdict, the headers to send, whether to refuse). The middleware
sends it.
"""

from __future__ import annotations

import math
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Final, TypeVar

from mypy_extensions import mypyc_attr
from starlette.types import ASGIApp, Scope

from .asgi import Header
from .blocked import Blocked, BlockedKeys
from .breaker import Gate
from .decision import Decision, Verdict
from .events import DecisionEvent, DecisionHook, Source, call_hook, log_denial
from .failure import GuardedStorage
from .headers import HeaderFormat
from .identity import Caller, Identity
from .limit_sets import LimitSet, LimitSets, enforced_denial, with_shadowed
from .limits import Limit
from .metrics import Metrics
from .outcome import Charge, Outcome, Rendered
from .responses import Refusals
from .route_table import RouteTable
from .routes import NO_ROUTE, RouteRule, RouteSpec
from .settings import RateLimitSettings
from .storage import Storage
from .tiers import Tier, TierTable

if TYPE_CHECKING:
    from .overrides.view import Overrides

__all__ = ["STATE_KEY", "Limiter", "limiter_of"]

T = TypeVar("T")

_BLOCK = Limit("1/second", "fixed_window", name="blocked")
"""The policy a block of a caller whose tier has no limits is reported under."""

STATE_KEY: Final = "ratelimit"
"""Where ``scope["state"]`` holds the limiter of the request (for the quota endpoints and
``IdempotencyMiddleware``)."""


def limiter_of(scope: Scope) -> Limiter | None:
    """The limiter that decided ``scope``, if a ``RateLimitMiddleware`` did."""
    state = scope.get("state")
    limiter = state.get(STATE_KEY) if isinstance(state, dict) else None
    return limiter if isinstance(limiter, Limiter) else None


@mypyc_attr(allow_interpreted_subclasses=True)
class Limiter:
    """Decides requests of ``app`` against the tiers and route limits of ``settings``.

    A request is decided without awaiting (``charge_now``, then ``decide_now``) when the
    key function, the tier resolver and the storage all answer at once; else by
    ``charge`` and ``decide``.
    """

    __slots__ = (
        "_blocked",
        "_format",
        "_on_decision",
        "_route_cache",
        "_shadow",
        "_usage",
        "clock",
        "guarded",
        "identity",
        "limit_sets",
        "overrides",
        "refusals",
        "routes",
        "settings",
        "storage",
    )

    def __init__(
        self, app: ASGIApp, settings: RateLimitSettings, *, storage: Storage,
        identity: Identity, rules: Sequence[RouteRule] = (),
        on_decision: DecisionHook | None = None, clock: Callable[[], float] = time.time,
        breaker: Gate | None = None, refusals: Refusals | None = None,
        metrics: Metrics | None = None, overrides: Overrides | None = None,
    ) -> None:
        self.settings = settings
        self.storage = storage
        self.identity = identity
        self.clock = clock
        """The wall clock (epoch seconds) times are reported on."""
        self.guarded = GuardedStorage(
            storage, mode=settings.failure_mode, timeout=settings.storage_timeout,
            recovery_interval=settings.recovery_interval, breaker=breaker, clock=clock,
            metrics=metrics, max_pending=settings.max_pending_decisions)
        self._format = HeaderFormat(settings.header_style, partition_key=settings.partition_key)
        self._shadow = settings.shadow
        self._usage = settings.quota_history
        self._on_decision = on_decision
        self.refusals = refusals if refusals is not None else Refusals(settings.response_format)
        """Renders the refusals this limiter's outcomes carry."""
        self.routes = RouteTable(app, [*settings.build_routes(), *rules], settings.exempt_paths)
        # The table's own cache, read here first: the table is interpreted code, and a
        # call into it costs more than the look-up.
        self._route_cache: dict[tuple[str, ...], RouteSpec] = self.routes.cache
        self.limit_sets = LimitSets(self._format, settings.concurrency_lease)
        self.limit_sets.check(identity.tiers.tiers.values(), self.routes.known_specs())
        # Only denials of a shared storage are kept: one in this process answers as fast.
        self._blocked = BlockedKeys(0 if settings.shadow else settings.blocked_cache_size)
        # Per-caller tiers, limits and blocks set at run time (``ratelimit_mw.overrides``).
        self.overrides = overrides
        if overrides is not None:
            overrides.attach(identity.tiers, self._blocked.forget)

    @property
    def tiers(self) -> TierTable:
        """The tiers this limiter knows."""
        return self.identity.tiers

    @property
    def identifies_now(self) -> bool:
        """True when a request's caller is found without awaiting (``charge_now``)."""
        return self.identity.answers_now

    async def identify(self, scope: Scope) -> Caller | None:
        """Who ``scope`` counts for (None: not limited), as the limits resolve it, an
        override's tier included; also for routes the limits leave alone."""
        caller = await self.identity.caller(scope)
        if caller is not None and self.overrides is not None:
            applied = self.overrides.find(caller.key)
            if applied is not None:
                return Caller(caller.key, applied.tier_for(caller.tier))
        return caller

    def limit_set_for(self, tier: Tier, key: str | None = None) -> LimitSet:
        """The limit set of ``tier`` (of the caller ``key``, whose override applies) on a route
        without limits of its own (quota reports)."""
        if key is None:
            return self.limit_sets.get(tier, NO_ROUTE)
        return self._limit_set(key, tier, NO_ROUTE)

    def _limit_set(self, key: str, tier: Tier, route: RouteSpec) -> LimitSet:
        """The limit set of ``tier`` on ``route``, or the caller's override where one applies."""
        overrides = self.overrides
        if overrides is not None:
            applied = overrides.find(key)
            if applied is not None:
                return applied.limit_set(tier, route, self.limit_sets)
        return self.limit_sets.get(tier, route)

    @property
    def retry_after(self) -> int:
        """Whole seconds a client refused while the storage is down should wait."""
        return self.guarded.retry_after

    async def read(self, call: Callable[[], Awaitable[T]]) -> T:
        """A read of the storage (a quota report), under its breaker and a timeout."""
        return await self.guarded.read(call)

    def _route(self, scope: Scope) -> RouteSpec:
        spec = self._route_cache.get((scope["method"], scope["path"]))
        return spec if spec is not None else self.routes.resolve(scope)

    def charge_now(self, scope: Scope) -> Charge | None:
        """``charge``, for an identity that answers without awaiting."""
        route = self._route(scope)
        if route.exempt:
            return None
        identity = self.identity
        key = identity.key_now(scope)
        if key is None:
            return None
        return key, self._limit_set(key, identity.tier_now(scope), route)

    async def charge(self, scope: Scope) -> Charge | None:
        """What ``scope`` counts against; None when it is not limited (an exempt route,
        or a key function that leaves it alone)."""
        route = self._route(scope)
        if route.exempt:
            return None
        identity = self.identity
        key = await identity.key_of(scope)
        if key is None:
            return None
        return key, self._limit_set(key, await identity.tier_of(scope), route)

    def decide_now(self, charge: Charge) -> Outcome | None:
        """The outcome, if the storage decides without awaiting; else None (``decide``)."""
        key, limit_set = charge
        if limit_set.blocked_until:
            return self._from_override_block(key, limit_set)
        guarded = self.guarded
        usage = self._usage and limit_set.route.cost
        verdict = guarded.decide_now(key, limit_set.hits, usage)
        if verdict is None:
            return None
        if not verdict.allowed and limit_set.shadow_only(verdict):
            verdict = with_shadowed(
                limit_set, verdict, guarded.decide_now(key, limit_set.enforced, usage))
        seen = verdict
        refused = False
        if not verdict.allowed:  # an admitted verdict is reported as it is
            verdict, refused = self._as_reported(limit_set, verdict)
        now = verdict.at if verdict.at is not None else self.clock()
        return self._finish(key, limit_set, verdict, "storage", refused, now, seen=seen)

    async def decide(self, charge: Charge) -> Outcome:
        """The outcome, from the storage under the failure policy (or the cache of
        blocked keys)."""
        key, limit_set = charge
        if limit_set.blocked_until:
            return self._from_override_block(key, limit_set)
        now = self.clock()
        if len(self._blocked):  # none kept (the usual): no look-up to make
            blocked = self._blocked.get(key, limit_set, now)
            if blocked is not None:
                return self._from_blocked(key, limit_set, blocked, now)
        guarded = self.guarded
        usage = self._usage and limit_set.route.cost
        verdict, source = await guarded.decide(key, limit_set.hits, usage=usage)
        # Closed: nothing is admitted undecided; but shadow mode never refuses.
        closed = guarded.mode == "closed" and not self._shadow
        if verdict is None:
            return self._finish(key, limit_set, None, source, closed, now)
        if not verdict.allowed and limit_set.shadow_only(verdict):
            # A denial consumes nothing: without a second call, a request let through by
            # a shadow limit would not count against the limits that do block.
            enforced, source = await guarded.decide(key, limit_set.enforced, usage=usage)
            if enforced is None and closed:
                return self._finish(key, limit_set, None, source, True, now)
            verdict = with_shadowed(limit_set, verdict, enforced)
        seen = verdict  # for the metrics hook, shadow denials included
        refused = False
        if not verdict.allowed:  # an admitted verdict is reported as it is
            verdict, refused = self._as_reported(limit_set, verdict)
        # Only the shared storage's denials are kept: a fallback's are local guesses.
        if refused and self._blocked.size and source == "storage":
            # From the clock after the answer: the wait began at most then, and a
            # Retry-After counted from before the round trip would point too early.
            self._blocked.keep(key, limit_set, verdict, self.clock())
        return self._finish(key, limit_set, verdict, source, refused, now, seen=seen)

    def _as_reported(self, limit_set: LimitSet, verdict: Verdict) -> tuple[Verdict, bool]:
        """A denied verdict as the client is told it, and whether the request is refused
        (not in shadow mode; a real denial reports only what the enforced limits say)."""
        refused = not self._shadow
        if refused and limit_set.shadow:
            return enforced_denial(limit_set, verdict), True
        return verdict, refused

    def _from_blocked(self, key: str, limit_set: LimitSet, blocked: Blocked,
                      now: float) -> Outcome:
        """The answer for a key known to be over its limit, without the storage.

        The outcome (its rendered 429 with it) is reused while its Retry-After stays the
        same, so a client hammering away costs little more than a dict lookup.
        """
        wait = math.ceil(blocked.until - now)
        outcome = blocked.outcome
        if outcome is None or blocked.wait != wait:
            outcome = self._finish(key, limit_set, blocked.verdict_at(now), "blocked", True, now)
            self._blocked.made(key, limit_set, blocked, outcome, wait)
            return outcome
        verdict = outcome.verdict
        assert verdict is not None  # a blocked outcome always holds its verdict
        log_denial(key, limit_set.tier.name, limit_set.route.label, verdict, shadow=False,
                   source="blocked")
        if self._on_decision is not None:
            call_hook(self._on_decision, DecisionEvent(
                key, limit_set.tier.name, limit_set.route.label, "blocked", verdict, True, False))
        return outcome

    def _from_override_block(self, key: str, limit_set: LimitSet) -> Outcome:
        """The 429 of a caller an override blocks: every limit spent until the block
        ends, ``Retry-After`` pointing there, without asking the storage."""
        now = self.clock()
        wait = max(1, math.ceil(limit_set.blocked_until - now))
        verdict = Verdict(False, tuple(
            Decision(False, hit.limit.capacity, 0, wait, wait, hit.limit, hit.scope)
            for hit in limit_set.hits) or (Decision(False, 0, 0, wait, wait, _BLOCK),), (), now)
        return self._finish(key, limit_set, verdict, "override", not self._shadow, now,
                            blocked_for=wait)

    def _finish(self, key: str, limit_set: LimitSet, verdict: Verdict | None, source: Source,
                refused: bool, now: float, *, seen: Verdict | None = None,
                blocked_for: int = 0) -> Outcome:
        """Headers, the denial log line, the metrics hook and the refusal to send, for one
        decision.

        ``seen``: the verdict as decided, for the metrics hook, when ``verdict`` is what
        the client is told and the log says (a real denial, without the shadow limits'
        say). ``blocked_for``: the seconds an override still blocks the caller.
        """
        if seen is None:
            seen = verdict
        headers: list[Header]
        if verdict is None:
            headers = []
        else:
            if verdict.at is not None:
                # Epoch times (X-RateLimit-Reset, reset_at) on the storage's clock: with
                # Redis, the server's, so app servers with skewed clocks report the same.
                now = verdict.at
            if not self._format:
                headers = []
            else:  # the list the format makes is the only one made
                headers = self._format.dynamic(verdict, limit_set.names, now, key,
                                               limit_set.metered)
                if limit_set.static_headers:
                    headers = [*limit_set.static_headers, *headers]
            if not verdict.allowed:
                log_denial(key, limit_set.tier.name, limit_set.route.label, verdict,
                           shadow=not refused, source=source)
            elif limit_set.shadow and not all(d.allowed for d in verdict.decisions):
                # Only shadow limits denied: a shadow denial, logged, let through.
                log_denial(key, limit_set.tier.name, limit_set.route.label, Verdict(False, tuple(
                    d for d in verdict.decisions if not d.allowed)), shadow=True, source=source)
        if self._on_decision is not None:
            # A shadow denial: a limit denied (global shadow mode, or a shadow limit of
            # its own) and the request goes through.
            shadow = (not refused and seen is not None
                      and not all(d.allowed for d in seen.decisions))
            call_hook(self._on_decision, DecisionEvent(
                key, limit_set.tier.name, limit_set.route.label, source, seen, refused, shadow))
        if blocked_for and not limit_set.hits:
            headers = []  # no limit to report: Retry-After alone says it
        if not refused:
            return Outcome(key, limit_set, verdict, source, False, headers, now)
        refusals = self.refusals
        response: Rendered | None
        if verdict is None:
            response = refusals.unavailable(self.retry_after)
        elif blocked_for:
            response = refusals.block(headers, blocked_for, now)
        else:
            response = refusals.denial(key, limit_set, verdict, headers, now)
        return Outcome(key, limit_set, verdict, source, True, headers, now, response)

"""The rate-limiting ASGI middleware.

``app.add_middleware(RateLimitMiddleware, tiers=[Tier("free", "100/minute")])``: every
HTTP request is keyed (client IP by default), given a tier and its route's limits,
and decided in one storage call; a 429 answers a denial, and rate-limit headers go
on every limited response.

What a decision leaves open until the request ends (a tier's ``concurrency`` slot,
taken in that same call) is ``holds.py``'s: closed just before the last body chunk
goes out (a streaming body holds it to its end, within its lease), or when the app
call ends otherwise (a client disconnect stops the response, the app raises).

The deciding is ``Limiter``'s; downstream handlers find it in
``scope["state"]["ratelimit"]`` (see ``ratelimit_mw.quota``).
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from functools import partial
from typing import TYPE_CHECKING, Any

from mypy_extensions import mypyc_attr
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .arguments import both, check_objects, check_settles, storage_from
from .breaker import Gate
from .callbacks import is_async_callable
from .decision import Lease, Verdict
from .disconnects import DisconnectWatch, DisconnectWatches
from .events import DecisionHook, Source
from .failure import FailureStats
from .holds import Holding, Holds, SettlingHolding
from .identity import KeyFunc, identity_from
from .limiter import STATE_KEY, Limiter
from .metrics import Metrics
from .outcome import Charge, Outcome
from .partitions import read_body, values_of
from .responses import DeniedHook, Refusals, denial_headers, denial_of, send_response
from .routes import RouteRule
from .sending import AddingHeaders, CompletingDenial
from .settings import RateLimitSettings
from .shaping import Turns
from .socket_messages import MessageLimits
from .startup import get_ready
from .storage import Storage
from .storage.urls import redacted
from .tiers import Tier, TierResolver, TierTable

if TYPE_CHECKING:
    from .overrides.view import Overrides

__all__ = ["RateLimitMiddleware"]

_log = logging.getLogger("ratelimit_mw")


@mypyc_attr(allow_interpreted_subclasses=True)
class RateLimitMiddleware:
    """Pure ASGI rate limiting for Starlette and FastAPI.

    ``settings`` (default: read from ``RATELIMIT_*`` variables) configures everything
    that can be written down (``RateLimitSettings(header_style="draft-11")``). Objects
    go in as arguments: a ``storage`` (default: from ``storage_url``), ``tiers`` (default:
    from settings), a ``key`` function (``"ip"``, ``"api_key"``, ``"user"`` or a
    sync/async callable of the scope), a ``tier_resolver`` (sync/async callable of
    the scope returning a tier name), route ``rules``, an ``on_denied`` hook for a
    custom 429, an ``on_decision`` hook for metrics, a ``clock`` (epoch seconds), a
    circuit ``breaker`` for the storage, ``metrics`` (a ``PrometheusMetrics`` or
    ``OTelMetrics`` of ``ratelimit_mw.metrics``) to count decisions, storage calls,
    slots and the storage breaker's state, and ``overrides`` (per-caller tiers, limits
    and blocks set at run time: ``ratelimit_mw.overrides``).
    """

    def __init__(
        self,
        app: ASGIApp,
        *,
        settings: RateLimitSettings | None = None,
        storage: Storage | None = None,
        tiers: Iterable[Tier] | Mapping[str, Tier] | TierTable | None = None,
        key: str | KeyFunc | None = None,
        tier_resolver: TierResolver | None = None,
        rules: Sequence[RouteRule] = (),
        on_denied: DeniedHook | None = None,
        on_decision: DecisionHook | None = None,
        clock: Callable[[], float] = time.time,
        breaker: Gate | None = None,
        metrics: Metrics | None = None,
        overrides: Overrides | None = None,
    ) -> None:
        check_objects(settings=settings, storage=storage, tier_resolver=tier_resolver,
                       on_denied=on_denied, on_decision=on_decision, clock=clock,
                       breaker=breaker, metrics=metrics)
        if settings is None:
            settings = RateLimitSettings()
        self.app = app
        self.settings = settings
        self._on_denied = on_denied
        self._on_denied_async = on_denied is not None and is_async_callable(on_denied)
        identity = identity_from(settings, tiers=tiers, key=key, tier_resolver=tier_resolver)
        self._owns_storage = storage is None
        # How start-up messages name the storage (never with its password).
        self._storage_name = redacted(settings.storage_url) if storage is None else repr(storage)
        if storage is None:
            storage = storage_from(settings, clock)
        if metrics is not None:
            on_decision = (metrics.decision if on_decision is None
                           else both(on_decision, metrics.decision))
        self.limiter = Limiter(app, settings, storage=storage, identity=identity, rules=rules,
                               on_decision=on_decision, clock=clock, breaker=breaker,
                               refusals=Refusals(settings.response_format,
                                                 custom=on_denied is not None),
                               metrics=metrics,
                               overrides=overrides)
        check_settles(storage, self.limiter)
        for pattern in self.limiter.routes.unreachable():
            _log.warning("ratelimit_mw: the route pattern %r matches no route of the app "
                         "(as its routes are when the middleware starts); its limits or "
                         "exemption never apply", pattern)
        self.messages = MessageLimits(
            self.limiter.guarded, per_caller=settings.websocket_messages,
            per_connection=settings.websocket_connection_messages,
            over_limit=settings.websocket_over_limit, metrics=metrics)
        self.holds = Holds(storage, self.limiter.guarded.fallback,
                           lease=settings.concurrency_lease, timeout=settings.storage_timeout,
                           metrics=metrics)
        self._watches = DisconnectWatches()
        self.turns = Turns(self.limiter, self.holds, cap=settings.max_held_requests,
                           metrics=metrics)

    @property
    def on_denied(self) -> DeniedHook | None:
        """The hook that makes the 429 instead of the default body, if any."""
        return self._on_denied

    @property
    def storage(self) -> Storage:
        """The storage the limits are decided on."""
        return self.limiter.storage

    @property
    def failure_stats(self) -> FailureStats:
        """Decisions made without the storage, by cause and by what answered them."""
        return self.limiter.guarded.stats

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self._not_http(scope, receive, send)
            return
        limiter = self.limiter
        state = scope.get("state")
        if state is None:
            state = scope["state"] = {}
        state[STATE_KEY] = limiter
        charge = limiter.charge_now(scope) if limiter.identifies_now else (
            await limiter.charge(scope))
        if charge is None:
            await self.app(scope, receive, send)
            return
        if charge[1].partitioned:
            charge, receive = await self._partitioned(scope, receive, charge)
        outcome = limiter.decide_now(charge)
        if outcome is None:
            outcome = await limiter.decide(charge)
        if outcome.refused:
            await self._refuse(scope, receive, send, outcome)
            return
        verdict = outcome.verdict
        if verdict is None or not (verdict.leases or outcome.limit_set.after):
            await self.app(scope, receive,
                           AddingHeaders(send, outcome.headers) if outcome.headers else send)
            return
        await self._holding(scope, receive, send, outcome, verdict)

    async def _partitioned(self, scope: Scope, receive: Receive,
                           charge: Charge) -> tuple[Charge, Receive]:
        """The charge of a request whose limits count apart per what it says (its
        body's start, read here and given to the app again)."""
        key, limit_set = charge
        body, receive = await read_body(receive)
        values = values_of(tuple(hit.limit.per for hit in limit_set.partitioned
                                 if hit.limit.per is not None), scope, body)
        return (key, self.limiter.limit_sets.partitioned(limit_set, values)), receive

    async def _holding(self, scope: Scope, receive: Receive, send: Send, outcome: Outcome,
                       verdict: Verdict) -> None:
        """Run the app while the request holds something (see ``Holding`` for when it is
        closed), its leases renewed while it runs; a shaped request once its turn has
        come (see ``Turns``)."""
        source, limit_set = outcome.source, outcome.limit_set
        leases, tier, headers = verdict.leases, limit_set.tier.name, outcome.headers
        if limit_set.shaped:
            turn = await self.turns.take(outcome, verdict, receive, send,
                                         partial(self._refuse, scope, receive, send))
            if turn is None:
                return
            receive, leases, headers = turn
            if not (leases or limit_set.settled):
                await self.app(scope, receive, AddingHeaders(send, headers) if headers else send)
                return
        if leases:
            self.holds.take(leases, source, tier)
        head = scope["method"] == "HEAD"
        sending = Holding(send, headers, self.holds, leases, source, tier, head
                          ) if not limit_set.settled else SettlingHolding(
            send, headers, self.holds, leases, source, tier, head, outcome.key,
            verdict.at if verdict.at is not None else outcome.now, limit_set.settled,
            scope["state"])
        watch = DisconnectWatch(receive, sending.close_soon, self._watches)
        # Not a finally, nor a bare raise: compiled with mypyc, either re-raises after an
        # await not the app's exception but one handled meanwhile (a failed release),
        # and loses a cancellation's match with its cancel scope (tests/middleware/
        # test_concurrency.py shows both). The modules on this path follow this rule.
        try:
            await self.app(scope, watch, sending)
        except BaseException as exc:
            if isinstance(exc, asyncio.CancelledError) and isinstance(sending, SettlingHolding):
                sending.keep_estimates()
            if self._app_ended(watch, sending):
                await sending.close()
            raise exc
        if self._app_ended(watch, sending):
            await sending.close()

    def _app_ended(self, watch: DisconnectWatch, sending: Holding) -> bool:
        """Stop watching and renewing; True when the holds are still to be closed (the
        response did not)."""
        watch.stop()
        if sending.leases:
            self.holds.drop(sending.leases, sending.tier)
        return sending.holding or (isinstance(sending, SettlingHolding) and sending.settling)

    async def _not_http(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Websockets (limited only when asked to), lifespan, anything else: passed on."""
        kind = scope["type"]
        if kind == "websocket" and (self.settings.limit_websockets or self.messages.on):
            await self._websocket(scope, receive, send)
        elif kind == "lifespan":
            await self.app(scope, self._closing(receive), self._starting(send))
        else:
            await self.app(scope, receive, send)

    async def _refuse(self, scope: Scope, receive: Receive, send: Send, outcome: Outcome) -> None:
        """The refusal the outcome carries (a 429, or the 503 of a storage that can't
        decide), or else the app's own ``on_denied`` response."""
        rendered = outcome.response
        if rendered is not None:
            await send_response(send, *rendered)
            return
        verdict = outcome.verdict
        assert verdict is not None and self._on_denied is not None  # see Refusals
        denial = denial_of(outcome.key, outcome.limit_set, verdict, outcome.now)
        response: Any = self._on_denied(scope, denial)
        if self._on_denied_async or inspect.isawaitable(response):
            response = await response
        await response(scope, receive,
                       CompletingDenial(send, denial_headers(outcome.headers, verdict)))

    async def _websocket(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Opt-in: limit websocket connects and the messages of each connection. A
        refused connect gets the 429 (headers and body) where the server offers the ASGI
        websocket denial response; elsewhere it is closed with 1008 before the
        handshake (clients see a 403). Messages: see ``MessageLimits``."""
        limiter = self.limiter
        state = scope.get("state")
        if state is None:
            state = scope["state"] = {}
        state[STATE_KEY] = limiter
        charge = await limiter.charge({**scope, "method": "WEBSOCKET"})
        if charge is None:
            await self.app(scope, receive, send)
            return
        if self.messages.on:
            receive = self.messages.receiving(charge[0], receive, send)
        if not self.settings.limit_websockets:
            await self.app(scope, receive, send)
            return
        outcome = await limiter.decide(charge)
        if outcome.refused:
            if "websocket.http.response" in (scope.get("extensions") or {}):
                await self._refuse(scope, receive, _websocket_response(send), outcome)
            else:
                await send({"type": "websocket.close", "code": 1008,
                            "reason": "rate limit exceeded"})
            return
        if outcome.headers:
            send = AddingHeaders(send, outcome.headers)  # on the accept (or the app's denial)
        verdict = outcome.verdict
        if verdict is None or not verdict.leases:
            await self.app(scope, receive, send)
            return
        # A websocket holds its slot while it is connected, its lease renewed meanwhile.
        leases, source, tier = verdict.leases, outcome.source, outcome.limit_set.tier.name
        self.holds.take(leases, source, tier)
        try:  # not a finally: see _holding
            await self.app(scope, receive, send)
        except BaseException as exc:
            await self._socket_ended(leases, source, tier)
            raise exc
        await self._socket_ended(leases, source, tier)

    async def _socket_ended(self, leases: tuple[Lease, ...], source: Source, tier: str) -> None:
        self.holds.drop(leases, tier)
        await self.holds.close(leases, source)

    def _starting(self, send: Send) -> Send:
        """When the app reports its start-up complete, get the storage ready first (see
        ``ratelimit_mw.startup``); a storage set up wrong fails the start-up instead."""
        async def wrapped(message: Message) -> None:
            if message["type"] == "lifespan.startup.complete":
                settings = self.settings
                refusal = await get_ready(
                    self.storage, self._storage_name, timeout=settings.startup_timeout,
                    required=settings.require_storage, failure_mode=settings.failure_mode)
                if refusal is not None:
                    if self._owns_storage:
                        await self.storage.close()
                    message = {"type": "lifespan.startup.failed", "message": refusal}
            await send(message)

        return wrapped

    def _closing(self, receive: Receive) -> Receive:
        """Load the overrides when the app starts; close the storage we opened and
        stop following the overrides when it shuts down."""
        overrides = self.limiter.overrides

        async def wrapped() -> Message:
            message = await receive()
            if message["type"] == "lifespan.startup" and overrides is not None:
                await overrides.start()
            elif message["type"] == "lifespan.shutdown":
                if overrides is not None:
                    await overrides.close()
                if self._owns_storage:
                    await self.storage.close()
            return message

        return wrapped

    def __repr__(self) -> str:
        return (f"RateLimitMiddleware(storage={self.storage!r}, "
                f"tiers={list(self.limiter.tiers.tiers)!r}, "
                f"header_style={self.settings.header_style!r})")


def _websocket_response(send: Send) -> Send:
    """``send`` for an HTTP response that denies a websocket handshake."""
    async def send_as_denial(message: Message) -> None:
        kind = message["type"]
        if kind.startswith("http.response."):  # a Starlette response already says websocket.
            message = {**message, "type": f"websocket.{kind}"}
        await send(message)

    return send_as_denial

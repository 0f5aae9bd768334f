"""The example app: every feature of ratelimit_mw in one FastAPI service.

Run it with ``./scripts/run-example`` (uvicorn on http://127.0.0.1:8000). Storage is
in memory unless ``RATELIMIT_STORAGE_URL=redis://127.0.0.1:6379/0`` (or a Cluster or
Sentinel URL) says otherwise, for the idempotency records as for the limits; the
tiers come from ``tiers.toml`` next to this file, and every other ``RATELIMIT_*``
variable overrides it.

``GET /metrics`` serves Prometheus metrics (``EXAMPLE_METRICS=off`` turns them off);
with several workers, ``PROMETHEUS_MULTIPROC_DIR`` names the directory they share
(``scripts/run-example``, the Dockerfile and docker-compose.yml set it up).

Callers send ``X-API-Key: demo-free`` (or ``demo-starter``, ``demo-pro``,
``demo-enterprise``); without a key they get the anonymous tier, keyed by client
IP; an unknown key gets 401 before anything is counted. ``demo-enterprise`` is given
negotiated limits by an override at start-up; with ``RATELIMIT_ADMIN_TOKEN`` set (the
run script sets a demo one) the admin API under ``/admin/ratelimit`` changes
overrides at run time.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import random
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from fastapi import Depends, FastAPI, Query
from fastapi.responses import JSONResponse
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from ratelimit_mw import (
    IdempotencyMiddleware,
    Limit,
    RateLimitMiddleware,
    RateLimitSettings,
    StorageError,
    TierByAPIKey,
    exempt,
    limit,
    quota_router,
)
from ratelimit_mw.breaker import CircuitBreaker, breaker_dependency
from ratelimit_mw.idempotency import (
    IdempotencyStore,
    MemoryIdempotencyStore,
    RedisIdempotencyStore,
)
from ratelimit_mw.metrics import PrometheusMetrics
from ratelimit_mw.openapi import document_limits
from ratelimit_mw.overrides import Override, Overrides, admin_router, caller_key

from .bodies import UNKNOWN_KEY, UNREADABLE_BODY, ErrorBody
from .charged import router as charged_router

TIERS_FILE = Path(__file__).with_name("tiers.toml")
API_KEYS = {
    "demo-free": "free",
    "demo-starter": "starter",
    "demo-pro": "pro",
    "demo-enterprise": "enterprise",
}

settings = RateLimitSettings.from_toml(TIERS_FILE)

metrics = (None if os.environ.get("EXAMPLE_METRICS", "on").lower() in ("off", "0", "false")
           else PrometheusMetrics())


class APIKeyAuth:
    """401 for an API key (in ``header``, as the rate limiter reads it) that is not one
    of ``keys`` (no key at all is anonymous).

    It runs before the rate limiter, so made-up keys never get counters of their own.
    """

    def __init__(self, app: ASGIApp, keys: dict[str, str], open_paths: tuple[str, ...],
                 header: str = "x-api-key") -> None:
        self.app = app
        self.keys = keys
        self.open_paths = open_paths
        self.header = header.lower().encode("latin-1")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in self.open_paths:
            await self.app(scope, receive, send)
            return
        sent = [value for name, value in scope["headers"] if name == self.header]
        if sent and b",".join(sent).decode("latin-1").strip() not in self.keys:
            response = JSONResponse(
                {"error": "unauthorized", "message": "Unknown API key."}, status_code=401,
                headers={"WWW-Authenticate": 'ApiKey realm="api"', "Cache-Control": "no-store"})
            await response(scope, receive, send)
            return
        await self.app(scope, receive, send)


def _idempotency_store() -> IdempotencyStore:
    """Idempotency records where the rate limits are: in memory, or on the same Redis
    (a URL it can't use fails here, at start-up, never falls back to memory)."""
    if settings.storage_url.lower().startswith("memory:"):
        return MemoryIdempotencyStore()
    return RedisIdempotencyStore.from_url(settings.storage_url,
                                          prefix=f"{settings.storage_prefix}idem:")


idempotency_store = _idempotency_store()
# Per-customer limits set at run time, kept where the counters are.
overrides = Overrides.from_url(settings.storage_url, prefix=settings.storage_prefix)
ENTERPRISE_DEAL = Override(
    caller_key("api_key:demo-enterprise"), plan="enterprise",
    limits=[Limit("5000/minute", "token_bucket", burst=10000, name="burst"),
            Limit("5000000/day", "fixed_window", name="daily")],
    concurrency=200, reason="negotiated limits (demo)")


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    # Each worker writes the same deal: the last write wins, and they are equal. A
    # storage down at start-up must not stop the app (an earlier write may be there).
    try:
        await overrides.set(ENTERPRISE_DEAL, by="example app start-up")
    except StorageError as exc:
        logging.getLogger("ratelimit_mw").warning(
            "example app: couldn't store demo-enterprise's override: %s", exc)
    # What start-up built stays for good: out of the garbage collector's view, a full
    # collection need not walk it (see docs/deployment.md, "Many keys in memory").
    gc.collect()
    gc.freeze()
    yield
    await idempotency_store.close()
    if metrics is not None:
        metrics.process_exited()


app = FastAPI(title="ratelimit_mw example", lifespan=lifespan)


# -- the flaky upstream behind a circuit breaker --------------------------------------

upstream_breaker = CircuitBreaker(
    name="upstream", window_size=10, minimum_calls=5, failure_rate_threshold=50.0,
    cooldown=10.0)
if metrics is not None:
    metrics.watch(upstream_breaker)


class UpstreamError(Exception):
    """The in-process stand-in for a failing dependency."""


async def flaky_upstream(failure_rate: float) -> dict[str, Any]:
    """An upstream service that fails ``failure_rate`` of the time."""
    await asyncio.sleep(0.005)
    if random.random() < failure_rate:
        raise UpstreamError("upstream failed")
    return {"upstream": "ok"}


# -- routes ---------------------------------------------------------------------------

@app.get("/health")
@exempt
async def health() -> dict[str, str | int]:
    return {"status": "ok", "worker": os.getpid()}


@app.get("/api/v1/hello", responses=UNKNOWN_KEY)
async def hello() -> dict[str, str | int]:
    return {"message": "hello", "worker": os.getpid()}


@app.get("/api/v1/slow", responses=UNKNOWN_KEY)
async def slow(seconds: float = Query(0.5, ge=0, le=30)) -> dict[str, float]:
    await asyncio.sleep(seconds)
    return {"slept": seconds}


@app.post("/api/v1/reports", status_code=201, responses=UNKNOWN_KEY)
@limit("2/minute", name="reports")
async def create_report() -> dict[str, str]:
    return {"report": "queued"}


@app.post("/api/v1/exports", status_code=202, responses=UNKNOWN_KEY)
@limit(Limit("2/second", "leaky_bucket", max_delay="5s", name="exports"))
async def create_export() -> dict[str, Any]:
    # A leaky bucket that holds: a burst is let in two a second, each request waiting up
    # to 5 s for its turn (Server-Timing says how long); past that, 429 at once.
    return {"export": "started", "worker": os.getpid()}


@app.post("/api/v1/payments", status_code=201, responses={**UNKNOWN_KEY, **UNREADABLE_BODY})
async def create_payment(payment: dict[str, Any]) -> dict[str, Any]:
    # Runs once per Idempotency-Key: a retry gets this same answer replayed.
    return {"payment_id": f"pay_{uuid.uuid4().hex[:16]}", "status": "succeeded", **payment}


@app.get("/api/v1/upstream", dependencies=[Depends(breaker_dependency(upstream_breaker))],
         responses={**UNKNOWN_KEY, 502: {"model": ErrorBody, "description": "The upstream "
                                          "failed (failure_rate of the calls do, on purpose)."}})
async def upstream(failure_rate: float = Query(0.0, ge=0, le=1)) -> JSONResponse:
    # A CircuitOpenError (the breaker opened since the dependency looked) is answered by
    # circuit_open_handler, which document_limits installs: the dependency's 503.
    try:
        result = await upstream_breaker.call(flaky_upstream, failure_rate)
    except UpstreamError:
        return JSONResponse({"error": "bad_gateway", "message": "the upstream failed"},
                            status_code=502)
    return JSONResponse(result)


app.include_router(charged_router)
app.include_router(quota_router())  # document_limits describes its two routes
if settings.admin_token is not None:
    app.include_router(admin_router(settings=settings))
else:
    logging.getLogger("ratelimit_mw").warning(
        "example app: RATELIMIT_ADMIN_TOKEN is not set; the admin API is not mounted")


@exempt
async def metrics_page(request: Request) -> Response:
    """Prometheus's scrape target (summed over the workers in multiprocess mode)."""
    assert metrics is not None  # the route exists only with metrics on
    return await metrics.endpoint(request)


if metrics is not None:
    app.add_route("/metrics", metrics_page, include_in_schema=False)

# Outermost last: unknown keys are refused first, then requests are rate limited,
# then a keyed payment is run at most once (its record is the caller's the rate limiter
# resolved, sending the same credentials).
app.add_middleware(IdempotencyMiddleware, store=idempotency_store,
                   required=["POST /api/v1/payments"], metrics=metrics)
# (mypy: Starlette's middleware-factory protocol can't express a positional-or-keyword
# ``settings`` parameter; the call is right.)
app.add_middleware(RateLimitMiddleware, settings=settings,  # type: ignore[arg-type]
                   tier_resolver=TierByAPIKey(API_KEYS, header=settings.api_key_header),
                   metrics=metrics, overrides=overrides)
app.add_middleware(APIKeyAuth, keys=API_KEYS, open_paths=("/health",),
                   header=settings.api_key_header)
# /openapi.json and /docs tell the limits, the 429 and 503, and the Idempotency-Key.
document_limits(app)

"""A small app behind the rate-limit middleware, for the reliability tests and the soak.

Run it with ``python -m uvicorn tests.reliability.app:app``. The middleware reads its
settings from the ``RATELIMIT_*`` environment variables (``RATELIMIT_STORAGE_URL``,
``RATELIMIT_FAILURE_MODE`` …); the app's own knobs are ``RL_APP_*``:

- ``RL_APP_LIMIT`` (default 100) and ``RL_APP_PERIOD`` (default ``hour``): the route
  limit of ``/alg/{algorithm}``, one route per algorithm (burst = the limit for
  ``token_bucket`` and ``gcra``), so one server tests every algorithm;
- ``RL_APP_CLOCK_SKEW``: seconds added to ``time.time`` in this process, set at import
  (before the middleware reads the clock), to play a server whose clock is off.

Every response says which worker answered (``x-worker-pid``) and where its rate-limit
decision came from (``x-rl-source``: ``storage``, ``blocked``, ``fallback`` or
``unavailable``, from the middleware's ``on_decision`` hook).
"""

from __future__ import annotations

import asyncio
import contextvars
import os
import time
from collections.abc import Callable

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ratelimit_mw.events import DecisionEvent
from ratelimit_mw.limits import ALGORITHM_NAMES
from ratelimit_mw.middleware import RateLimitMiddleware
from ratelimit_mw.routes import exempt, limit

__all__ = ["app", "build_app"]

_SKEW = float(os.environ.get("RL_APP_CLOCK_SKEW", "0") or 0)
if _SKEW:
    _real_time = time.time

    def _skewed_time() -> float:
        return _real_time() + _SKEW

    time.time = _skewed_time

_PID = str(os.getpid()).encode()
_source: contextvars.ContextVar[list[str]] = contextvars.ContextVar("rl_source")


def _record(event: DecisionEvent) -> None:
    """The on_decision hook: note the decision's source for the response header."""
    holder = _source.get(None)
    if holder is not None:
        holder.append(event.source)


class Tagged:
    """Outermost layer: adds ``x-worker-pid`` and ``x-rl-source`` to every response."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        holder: list[str] = []
        _source.set(holder)

        async def tagged(message: Message) -> None:
            if message["type"] == "http.response.start":
                source = holder[-1].encode() if holder else b"none"
                message["headers"] = [*message.get("headers", ()), (b"x-worker-pid", _PID),
                                      (b"x-rl-source", source)]
            await send(message)

        await self.app(scope, receive, tagged)


async def ok(request: Request) -> Response:
    return PlainTextResponse("ok")


@exempt
async def health(request: Request) -> Response:
    return PlainTextResponse("ok")


@exempt
async def clock(request: Request) -> Response:
    return JSONResponse({"time": time.time()})


async def slow(request: Request) -> Response:
    """Answers after ``?ms=`` milliseconds (at most 5 s): a slow endpoint."""
    try:
        ms = min(5000.0, max(0.0, float(request.query_params.get("ms", "200"))))
    except ValueError:
        ms = 200.0
    await asyncio.sleep(ms / 1000)
    return PlainTextResponse("slow")


def _algorithm_endpoint(name: str, amount: int, period: str) -> Callable[..., object]:
    burst = amount if name in ("token_bucket", "gcra") else None

    async def endpoint(request: Request) -> Response:
        return PlainTextResponse(name)

    limit(f"{amount}/{period}", name, burst=burst, name=name)(endpoint)
    return endpoint


def build_app() -> ASGIApp:
    """The app, configured from the environment."""
    amount = int(os.environ.get("RL_APP_LIMIT", "100"))
    period = os.environ.get("RL_APP_PERIOD", "hour")
    routes = [
        Route("/", ok),
        Route("/health", health),
        Route("/time", clock),
        Route("/slow", slow),
        *(Route(f"/alg/{name}", _algorithm_endpoint(name, amount, period))
          for name in ALGORITHM_NAMES),
    ]
    inner = Starlette(routes=routes)
    # Built here, not with add_middleware, so a bad configuration fails at import.
    limited = RateLimitMiddleware(inner, on_decision=_record, clock=time.time)
    return Tagged(limited)


app = build_app()

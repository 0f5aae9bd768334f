"""Two routes behind a ``SharedCircuitBreaker``, for the test that runs it in several workers.

``python -m uvicorn tests.reliability.breaker_app:app --workers 2``, with
``RL_APP_REDIS`` (the Redis that shares the breaker's state) and ``RL_APP_PREFIX`` (its
key prefix). ``/guarded/fail`` answers 500, ``/guarded/ok`` 200; three calls, all
failed, open the breaker for 30 s. Every response says which worker answered
(``x-worker-pid``).
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import Mount, Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ratelimit_mw.breaker.guard import BreakerGuard
from ratelimit_mw.breaker.shared import SharedCircuitBreaker

__all__ = ["app"]

_PID = str(os.getpid()).encode()

breaker = SharedCircuitBreaker(
    name="upstream", redis=os.environ["RL_APP_REDIS"], prefix=os.environ["RL_APP_PREFIX"],
    window_size=3, minimum_calls=3, cooldown=30, sync_interval=0.05)


async def ok(request: Request) -> PlainTextResponse:
    return PlainTextResponse("ok")


async def fail(request: Request) -> PlainTextResponse:
    return PlainTextResponse("upstream failed", status_code=500)


async def health(request: Request) -> PlainTextResponse:
    return PlainTextResponse("ok")


class _Tagged:
    """Adds ``x-worker-pid`` to every response."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def tagged(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", ()), (b"x-worker-pid", _PID)]
            await send(message)

        await self.app(scope, receive, tagged if scope["type"] == "http" else send)


@asynccontextmanager
async def _lifespan(app: Starlette) -> AsyncIterator[None]:
    await breaker.sync()  # reading the shared state starts before the first call
    yield
    await breaker.aclose()


guarded = BreakerGuard(Starlette(routes=[Route("/ok", ok), Route("/fail", fail)]),
                       breaker=breaker)
app = _Tagged(Starlette(routes=[Route("/health", health), Mount("/guarded", app=guarded)],
                        lifespan=_lifespan))

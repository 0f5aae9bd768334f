"""A small app with overrides and the admin API, for the multi-process tests
(``uvicorn tests.overrides.served_app:app``; configured by ``RATELIMIT_*``)."""

from __future__ import annotations

import os

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from ratelimit_mw import RateLimitMiddleware, RateLimitSettings, Tier
from ratelimit_mw.overrides import Overrides, admin_router
from ratelimit_mw.quota import quota_router

settings = RateLimitSettings()
overrides = Overrides.from_url(settings.storage_url, prefix=settings.storage_prefix)


async def health(request: Request) -> JSONResponse:
    return JSONResponse({"worker": os.getpid()})


async def hello(request: Request) -> JSONResponse:
    return JSONResponse({"worker": os.getpid()})


app = Starlette(routes=[Route("/health", health), Route("/hello", hello),
                        *quota_router().routes, *admin_router(settings=settings).routes])
app.add_middleware(RateLimitMiddleware, settings=settings, overrides=overrides,
                   tiers=[Tier("free", "100/minute"), Tier("pro", "1000/minute")])

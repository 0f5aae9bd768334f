"""Fixtures of the start-up tests: servers set up each way, and apps on them."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route

from ratelimit_mw.events import DecisionEvent
from ratelimit_mw.middleware import RateLimitMiddleware
from ratelimit_mw.settings import RateLimitSettings
from ratelimit_mw.tiers import Tier
from tests.redis_servers import RedisProcess
from tests.startup.servers import TLSRedis, locked_redis, tls_redis

AppFactory = Callable[..., RateLimitMiddleware]


async def ok(request: Request) -> Response:
    return PlainTextResponse("ok")


@pytest.fixture(scope="module")
def locked() -> Iterator[RedisProcess]:
    """A redis-server wanting a password, with ACL users lacking one command each."""
    with locked_redis() as process:
        yield process


@pytest.fixture(scope="module")
def tls() -> Iterator[TLSRedis]:
    """A redis-server on TLS, its certificate signed by a CA of its own."""
    with tls_redis() as server:
        yield server


@pytest.fixture
def events() -> list[DecisionEvent]:
    return []


@pytest.fixture
def app_on(events: list[DecisionEvent]) -> AppFactory:
    """``app_on(url, **settings)``: the middleware (5 a minute) on ``url``, a key prefix
    of its own; its decisions go to ``events``."""
    def make(url: str, **settings: Any) -> RateLimitMiddleware:
        return RateLimitMiddleware(
            Starlette(routes=[Route("/", ok)]), tiers=[Tier("t", "5/minute")],
            on_decision=events.append, settings=RateLimitSettings(
                storage_url=url, storage_prefix=f"rlstart:{uuid.uuid4().hex[:12]}:",
                **settings))
    return make

"""The peer libraries doing the same job as ratelimit_mw, for the middleware benchmark.

Each builder returns an ASGI app with one plain-text route, limited per client IP
to a rate never reached, with rate-limit headers where the library offers them:

    limits-memory / limits-redis          limits in a hand-written pure ASGI middleware
    slowapi-memory / slowapi-redis        slowapi's ASGI middleware, headers enabled
    asgi-ratelimit-memory / -redis        asgi-ratelimit's middleware
    fastapi-limiter-memory / -redis       fastapi-limiter 0.2 (pyrate-limiter) dependency
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

NEVER_REACHED = 1_000_000_000
PEERS = (
    "limits-memory", "limits-redis", "slowapi-memory", "slowapi-redis",
    "asgi-ratelimit-memory", "asgi-ratelimit-redis", "fastapi-limiter-memory",
    "fastapi-limiter-redis",
)


async def hello(request: Request) -> Response:
    return PlainTextResponse("hello")


class LimitsMiddleware:
    """limits' async sliding-window counter in a pure ASGI middleware, with headers."""

    def __init__(self, app: ASGIApp, storage_uri: str) -> None:
        import limits
        from limits.aio.strategies import SlidingWindowCounterRateLimiter
        from limits.storage import storage_from_string

        options = {"implementation": "redispy"} if storage_uri.startswith("async+redis") else {}
        self.app = app
        self.item = limits.parse(f"{NEVER_REACHED}/minute")
        self.limiter = SlidingWindowCounterRateLimiter(storage_from_string(storage_uri, **options))

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        key = scope["client"][0] if scope.get("client") else "-"
        if not await self.limiter.hit(self.item, key):
            await PlainTextResponse("too many", status_code=429)(scope, receive, send)
            return
        stats = await self.limiter.get_window_stats(self.item, key)
        headers = [(b"x-ratelimit-limit", str(self.item.amount).encode()),
                   (b"x-ratelimit-remaining", str(stats.remaining).encode()),
                   (b"x-ratelimit-reset", str(int(stats.reset_time)).encode())]

        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), *headers]
            await send(message)

        await self.app(scope, receive, with_headers)


def _limits(storage_uri: str) -> ASGIApp:
    app = Starlette(routes=[Route("/", hello)])
    return LimitsMiddleware(app, storage_uri)


def _slowapi(storage_uri: str) -> ASGIApp:
    from slowapi import Limiter, _rate_limit_exceeded_handler
    from slowapi.errors import RateLimitExceeded
    from slowapi.middleware import SlowAPIASGIMiddleware
    from slowapi.util import get_remote_address

    limiter = Limiter(key_func=get_remote_address, default_limits=[f"{NEVER_REACHED}/minute"],
                      storage_uri=storage_uri, headers_enabled=True)
    app = Starlette(routes=[Route("/", hello)])
    app.state.limiter = limiter
    app.add_exception_handler(RateLimitExceeded, _rate_limit_exceeded_handler)  # type: ignore[arg-type]
    app.add_middleware(SlowAPIASGIMiddleware)
    return app


def _asgi_ratelimit(redis_url: str | None) -> ASGIApp:
    from ratelimit import RateLimitMiddleware, Rule
    from ratelimit.backends.redis import RedisBackend
    from ratelimit.backends.simple import MemoryBackend
    from redis.asyncio import StrictRedis

    async def client_ip(scope: Scope) -> tuple[str, str]:
        return (scope["client"][0] if scope.get("client") else "-"), "default"

    backend = (MemoryBackend() if redis_url is None
               else RedisBackend(StrictRedis.from_url(redis_url)))
    return RateLimitMiddleware(Starlette(routes=[Route("/", hello)]), client_ip, backend,
                               {r"^/": [Rule(minute=NEVER_REACHED)]})


def _fastapi_limiter(redis_url: str | None, prefix: str) -> ASGIApp:
    from contextlib import asynccontextmanager

    from fastapi import Depends, FastAPI
    from fastapi_limiter.depends import RateLimiter
    from pyrate_limiter import Duration, InMemoryBucket, Limiter, Rate

    rates = [Rate(NEVER_REACHED, Duration.MINUTE)]
    holder: dict[str, Any] = {"limiter": Limiter(InMemoryBucket(rates))}

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> Any:
        if redis_url is not None:
            from pyrate_limiter.buckets.redis_bucket import RedisBucket
            from redis.asyncio import Redis

            bucket = await RedisBucket.init(rates, Redis.from_url(redis_url), f"{prefix}fl")
            holder["limiter"] = Limiter(bucket)
        yield

    async def limited(request: Request, response: Response) -> None:
        await RateLimiter(limiter=holder["limiter"])(request, response)

    app = FastAPI(lifespan=lifespan)

    @app.get("/", dependencies=[Depends(limited)])
    async def root() -> PlainTextResponse:
        return PlainTextResponse("hello")

    return app


def build(name: str, redis_url: str, prefix: str) -> ASGIApp:
    """The peer app called ``name`` (one of ``PEERS``)."""
    builders: dict[str, Callable[[], ASGIApp]] = {
        "limits-memory": lambda: _limits("async+memory://"),
        "limits-redis": lambda: _limits(redis_url.replace("redis://", "async+redis://", 1)),
        "slowapi-memory": lambda: _slowapi("memory://"),
        "slowapi-redis": lambda: _slowapi(redis_url),
        "asgi-ratelimit-memory": lambda: _asgi_ratelimit(None),
        "asgi-ratelimit-redis": lambda: _asgi_ratelimit(redis_url),
        "fastapi-limiter-memory": lambda: _fastapi_limiter(None, prefix),
        "fastapi-limiter-redis": lambda: _fastapi_limiter(redis_url, prefix),
    }
    if name not in builders:
        msg = f"unknown peer app {name!r}; expected one of {', '.join(PEERS)}"
        raise ValueError(msg)
    return builders[name]()

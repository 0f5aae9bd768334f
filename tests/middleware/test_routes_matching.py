"""Which route a request is charged to: included FastAPI routers, root paths and mounts,
methods, hosts, endpoint classes, path patterns."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from fastapi import APIRouter, Depends, FastAPI
from starlette.applications import Starlette
from starlette.endpoints import HTTPEndpoint
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Host, Mount, Route, Router

from ratelimit_mw import ConfigError, MemoryStorage, RateLimitSettings
from ratelimit_mw.middleware import RateLimitMiddleware
from ratelimit_mw.routes import RouteRule, cost, exempt, limit
from ratelimit_mw.tiers import Tier
from tests.conftest import FakeClock

from .conftest import client_for, make_app, ok

TIER = [Tier("t", "10/minute")]


def _included_app(memory: MemoryStorage, clock: FakeClock) -> FastAPI:
    router = APIRouter(prefix="/v1")

    @router.post("/reports")
    @limit("2/minute", name="reports")
    async def reports() -> dict[str, str]:
        return {}

    @router.get("/health")
    @exempt
    async def health() -> dict[str, str]:
        return {}

    @router.get("/search")
    @cost(5)
    async def search() -> dict[str, str]:
        return {}

    @router.get("/export", dependencies=[Depends(limit("1/minute", name="export"))])
    async def export() -> dict[str, str]:
        return {}

    inner = APIRouter(prefix="/inner", dependencies=[Depends(limit("1/minute", name="inner"))])

    @inner.get("/x")
    async def x() -> dict[str, str]:
        return {}

    router.include_router(inner)
    app = FastAPI()
    app.include_router(router)
    app.add_middleware(RateLimitMiddleware, tiers=TIER, storage=memory, clock=clock)
    return app


async def test_the_marks_of_an_included_routers_routes_count(
    memory: MemoryStorage, clock: FakeClock,
) -> None:
    """@limit, @exempt, @cost, a dependency and a router's own dependencies, on routes of
    an included APIRouter (newer FastAPI keeps it as one route of its own)."""
    async with client_for(_included_app(memory, clock)) as client:
        reports = [(await client.post("/v1/reports")).status_code for _ in range(3)]
        exports = [(await client.get("/v1/export")).status_code for _ in range(2)]
        inner = [(await client.get("/v1/inner/x")).status_code for _ in range(2)]
        searched = await client.get("/v1/search")
        health = [(await client.get("/v1/health")).status_code for _ in range(12)]
    assert reports == [200, 200, 429]
    assert exports == [200, 429]
    assert inner == [200, 429]
    # 2 reports + 1 export + 1 inner admitted (the 429s took nothing), then 5 for search
    assert searched.headers["x-ratelimit-remaining"] == str(10 - 4 - 5)
    assert health == [200] * 12


def test_an_included_routes_limit_that_can_never_pass_fails_at_start_up(
    memory: MemoryStorage,
) -> None:
    router = APIRouter()

    @router.get("/big")
    @cost(50)
    async def big() -> dict[str, str]:
        return {}

    app = FastAPI()
    app.include_router(router, prefix="/v2")
    with pytest.raises(ConfigError, match="/v2/big"):
        RateLimitMiddleware(app.router, tiers=TIER, storage=memory)


@pytest.mark.parametrize("where", ["root_path", "mount"])
async def test_exempt_paths_and_rules_match_below_the_root_path(
    memory: MemoryStorage, clock: FakeClock, where: str,
) -> None:
    """Behind ``--root-path /api`` (the server puts it in front of the path) and on an
    app mounted at /api, exempt paths and rules match the path the app routes on."""
    options: dict[str, Any] = {
        "tiers": [Tier("t", "3/minute")], "storage": memory, "clock": clock,
        "exempt_paths": ["/health"],
        "rules": [RouteRule("/search", limits="2/minute")]}
    inner = make_app([Route("/health", ok), Route("/search", ok)], **options)
    if where == "mount":
        app: Any = Starlette(routes=[Mount("/api", app=inner)])
        transport = httpx.ASGITransport(app=app, client=("192.0.2.1", 1))
    else:
        transport = httpx.ASGITransport(app=inner, root_path="/api", client=("192.0.2.1", 1))
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        health = [(await client.get("/api/health")).status_code for _ in range(5)]
        search = [(await client.get("/api/search")).status_code for _ in range(3)]
    assert health == [200] * 5
    assert search == [200, 200, 429]


async def test_get_and_post_endpoints_at_one_path_count_apart(
    memory: MemoryStorage, clock: FakeClock,
) -> None:
    """Two endpoints at one path, marked alike, have counters of their own."""
    @limit("3/minute", name="list")
    async def list_items(request: Request) -> Response:
        return PlainTextResponse("list")

    @limit("3/minute", name="create")
    async def create_item(request: Request) -> Response:
        return PlainTextResponse("made")

    app = make_app([Route("/items", list_items, methods=["GET"]),
                    Route("/items", create_item, methods=["POST"])],
                   tiers=[Tier("t", "100/minute")], storage=memory, clock=clock)
    async with client_for(app) as client:
        gets = [(await client.get("/items")).status_code for _ in range(3)]
        post = await client.post("/items")
    assert gets == [200, 200, 200]
    assert post.status_code == 200
    assert post.headers["x-ratelimit-remaining"] == "2"


async def test_a_preflight_or_a_405_does_not_charge_the_routes_own_limit(
    memory: MemoryStorage, clock: FakeClock,
) -> None:
    """A CORS preflight (answered before the endpoint) and a GET answered 405 never
    run the POST endpoint, so its own limit is not charged; the tier's still is."""
    @limit("1/minute", name="create")
    async def create(request: Request) -> Response:
        return PlainTextResponse("made")

    app = Starlette(routes=[Route("/items", create, methods=["POST"])])
    app.add_middleware(CORSMiddleware, allow_origins=["https://a.example"],
                       allow_methods=["POST"])
    app.add_middleware(RateLimitMiddleware, tiers=[Tier("t", "100/minute")], storage=memory,
                       clock=clock)
    preflight = {"origin": "https://a.example", "access-control-request-method": "POST"}
    async with client_for(app) as client:
        options = [(await client.options("/items", headers=preflight)).status_code
                   for _ in range(2)]
        wrong = await client.get("/items")
        post = await client.post("/items")
    assert options == [200, 200]
    assert wrong.status_code == 405
    assert wrong.headers["x-ratelimit-remaining"] == "97"  # the tier counts everything
    assert post.status_code == 200


async def test_hosts_keep_their_own_marks_whichever_is_seen_first(
    memory: MemoryStorage, clock: FakeClock,
) -> None:
    """One path on two Host routes: each host's marks apply to its own requests, in
    either order (the route cache must not give one host's answer to the other)."""
    @limit("1/minute", name="admin-login")
    async def admin_login(request: Request) -> Response:
        return PlainTextResponse("admin")

    @exempt
    async def www_login(request: Request) -> Response:
        return PlainTextResponse("www")

    app = make_app([Host("admin.example.com", app=Starlette(routes=[Route("/login", admin_login)])),
                    Host("www.example.com", app=Starlette(routes=[Route("/login", www_login)]))],
                   tiers=[Tier("t", "2/minute")], storage=memory, clock=clock)
    async with client_for(app) as client:
        www = [(await client.get("http://www.example.com/login")).status_code for _ in range(3)]
        admin = [(await client.get("http://admin.example.com/login")).status_code
                 for _ in range(2)]
        again = (await client.get("http://www.example.com/login")).status_code
    assert www == [200, 200, 200]
    assert admin == [200, 429]
    assert again == 200


async def test_head_is_limited_like_the_get_of_an_endpoint_class(
    memory: MemoryStorage, clock: FakeClock,
) -> None:
    """Starlette answers HEAD with an HTTPEndpoint's ``get``: its marks apply, on the
    same counter."""
    runs = []

    class Report(HTTPEndpoint):
        @limit("2/minute", name="report")
        async def get(self, request: Request) -> Response:
            runs.append(request.method)
            return PlainTextResponse("report")

    app = make_app([Route("/report", Report)], tiers=[Tier("t", "100/minute")],
                   storage=memory, clock=clock)
    async with client_for(app) as client:
        codes = [(await client.get("/report")).status_code,
                 (await client.head("/report")).status_code,
                 (await client.head("/report")).status_code]
    assert codes == [200, 200, 429]
    assert runs == ["GET", "HEAD"]


def test_an_endpoint_classs_other_methods_are_checked_at_start_up(
    memory: MemoryStorage,
) -> None:
    """A cost that can never pass on an HTTPEndpoint's ``post`` fails at start-up."""
    class Reports(HTTPEndpoint):
        async def get(self, request: Request) -> Response:
            return PlainTextResponse("list")

        @cost(50)
        async def post(self, request: Request) -> Response:
            return PlainTextResponse("made")

    router = Starlette(routes=[Route("/reports", Reports)]).router
    with pytest.raises(ConfigError, match="could never pass"):
        RateLimitMiddleware(router, tiers=TIER, storage=memory)


def test_path_patterns() -> None:
    """``{name:path}`` spans segments as in Starlette; white space is refused."""
    rule = RouteRule("/files/{path:path}", limits="1/minute")
    assert rule.matches("GET", "/files/a/b.txt")
    assert not RouteRule("/files/{name}", limits="1/minute").matches("GET", "/files/a/b.txt")
    with pytest.raises(ConfigError, match=r"white space.*'/health /metrics'"):
        RouteRule("/health /metrics", exempt=True)


async def test_a_line_feed_in_the_path_does_not_dodge_a_rule(
    clock: FakeClock, memory: MemoryStorage,
) -> None:
    """Starlette runs ``/reports`` for ``/reports%0A`` (its ``$`` allows a final line
    feed) and ``/items/{id}`` for ``/items/1%0Ax``: the rules count them all the same."""
    async def echo(request: Request) -> Response:
        return PlainTextResponse(repr(request.scope["path"]))

    routes = [Route("/reports", echo), Route("/items/{id}", echo)]
    rules = [RouteRule("/reports", limits="2/minute"), RouteRule("/items/*", limits="2/minute")]
    app = make_app(routes, tiers=[Tier("t", "100/minute")], storage=memory, clock=clock,
                   rules=rules)
    async with client_for(app) as client:
        reports = [await client.get(path) for path in
                   ("/reports", "/reports%0A", "/reports%0a", "/reports")]
        items = [await client.get(path) for path in ("/items/1%0Ax", "/items/1%0A", "/items/1")]
    assert reports[1].text == repr("/reports\n")  # the endpoint did run for it
    assert [r.status_code for r in reports] == [200, 200, 429, 429]
    assert [r.status_code for r in items] == [200, 200, 429]
    assert RouteRule("/files/{name}", limits="1/minute").matches("GET", "/files/a\nb")
    assert not RouteRule("/reports", limits="1/minute").matches("GET", "/reports\n\n")


def test_patterns_that_match_no_route_are_named_at_start_up(
    memory: MemoryStorage, caplog: pytest.LogCaptureFixture,
) -> None:
    """A typo, or a trailing slash the routes don't have: a warning names each rule
    or exempt path no route can match; those that can match are not named."""
    import logging

    static = Starlette()  # mounted, without routes of its own: anything below it
    app = Starlette(routes=[Route("/search", ok), Route("/items", ok),
                            Route("/files/{path:path}", ok), Route("/users/{id}", ok),
                            Route("/users/me/{what}", ok),
                            Route("/orgs/{org}/repos/{repo:path}", ok),
                            Route("/teams/{id}/posts", ok),
                            Mount("/static", app=static),
                            Mount("/v1", app=Router(routes=[Route("/health", ok)],
                                                    default=PlainTextResponse("legacy")))])
    rules = [RouteRule("/serach", limits="1/minute"), RouteRule("/items/", limits="1/minute"),
             RouteRule("/files/*", limits="1/minute"), RouteRule("/users/42", limits="1/minute"),
             RouteRule("/users/{uid}", limits="1/minute"),
             RouteRule("/static/app.js", limits="1/minute"),
             # parameters in different segments of the rule and the route
             RouteRule("/users/{id}/avatar", limits="1/minute"),
             RouteRule("/orgs/acme/*", limits="1/minute"),
             RouteRule("/*/acme/repos/x", limits="1/minute"),
             # typos in patterns with parameters are still named
             RouteRule("/teams/{id}/posts/", limits="1/minute"),
             RouteRule("/teams/{id}/postz", limits="1/minute"),
             # below a mounted router with a default app: anything may be answered
             RouteRule("/v1/orders/*", limits="1/minute")]
    with caplog.at_level(logging.WARNING, logger="ratelimit_mw"):
        RateLimitMiddleware(
            app.router,
            tiers=TIER,
            storage=memory,
            rules=rules,
            settings=RateLimitSettings(exempt_paths=["/health", "/search"]),
        )
    named = [message for message in caplog.messages if "matches no route" in message]
    assert sorted(named) == sorted(
        f"ratelimit_mw: the route pattern {p!r} matches no route of the app (as its routes "
        f"are when the middleware starts); its limits or exemption never apply"
        for p in ("/serach", "/items/", "/teams/{id}/posts/", "/teams/{id}/postz", "/health"))


def test_a_method_no_standard_defines_is_named(caplog: pytest.LogCaptureFixture) -> None:
    import logging

    with caplog.at_level(logging.WARNING, logger="ratelimit_mw"):
        RouteRule("/search", methods=["GTE"], limits="1/minute")
        RouteRule("/dav", methods=["PROPFIND", "get"], limits="1/minute")
    assert [m for m in caplog.messages if "no method" in m] == [
        "ratelimit_mw: route '/search': 'GTE' is no method HTTP or WebDAV defines (a typo?); "
        "the rule applies only to requests of that method"]


def test_an_app_with_frontend_routes_is_not_judged(
    memory: MemoryStorage, caplog: pytest.LogCaptureFixture, tmp_path: Any,
) -> None:
    """FastAPI keeps frontend routes apart from its routes: patterns they serve are not
    named (the check can't see them)."""
    import logging

    app = FastAPI()
    if not hasattr(app, "frontend"):
        pytest.skip("this FastAPI has no frontend routes")
    (tmp_path / "index.html").write_text("<html>app</html>")
    app.frontend("/", directory=str(tmp_path))
    with caplog.at_level(logging.WARNING, logger="ratelimit_mw"):
        RateLimitMiddleware(
            app.router,
            tiers=TIER,
            storage=memory,
            settings=RateLimitSettings(exempt_paths=["/assets/*", "/"]),
        )
    assert not [m for m in caplog.messages if "matches no route" in m]


def test_a_router_with_a_default_app_is_not_judged(
    memory: MemoryStorage, caplog: pytest.LogCaptureFixture,
) -> None:
    """A router whose default app answers what no route does: no pattern is named."""
    import logging

    from starlette.routing import Router

    app = Router(routes=[Route("/search", ok)], default=PlainTextResponse("catch-all"))
    with caplog.at_level(logging.WARNING, logger="ratelimit_mw"):
        RateLimitMiddleware(
            app,
            tiers=TIER,
            storage=memory,
            settings=RateLimitSettings(exempt_paths=["/app/*"]),
        )
    assert not [m for m in caplog.messages if "matches no route" in m]

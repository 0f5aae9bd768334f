"""Per-route limits: @limit on Starlette and FastAPI, dependencies, exemptions, costs, rules."""

from __future__ import annotations

import pytest
from fastapi import Depends, FastAPI
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Mount, Route

from ratelimit_mw import ConfigError, Limit, MemoryStorage
from ratelimit_mw.middleware import RateLimitMiddleware
from ratelimit_mw.routes import RouteRule, cost, exempt, limit
from ratelimit_mw.tiers import Tier
from tests.conftest import FakeClock

from .conftest import client_for, make_app, ok


@limit("2/minute", name="search")
async def search(request: Request) -> Response:
    return PlainTextResponse("found")


@exempt
async def health(request: Request) -> Response:
    return PlainTextResponse("up")


@cost(5)
async def export(request: Request) -> Response:
    return PlainTextResponse("csv")


ROUTES = [Route("/", ok), Route("/search", search), Route("/health", health),
          Route("/export", export), Mount("/v1", routes=[Route("/search", search)])]


async def test_decorator_limit_stacks_on_tier(clock: FakeClock, memory: MemoryStorage) -> None:
    """A route's own limit applies on top of the tier's, and both are counted."""
    app = make_app(ROUTES, tiers=[Tier("t", [Limit("10/minute", name="tier")])],
                   storage=memory, clock=clock, header_style="draft-11")
    async with client_for(app) as client:
        first = await client.get("/search")
        await client.get("/search")
        third = await client.get("/search")
        other = await client.get("/")
    assert first.headers["ratelimit-policy"] == '"tier";q=10;w=60,"search";q=2;w=60'
    assert third.status_code == 429
    assert other.status_code == 200
    assert other.headers["ratelimit"].startswith('"tier";r=7;')


async def test_route_limit_is_per_route(clock: FakeClock, memory: MemoryStorage) -> None:
    """The same decorated endpoint mounted at two paths counts each path apart."""
    app = make_app(ROUTES, tiers=[Tier("t", "100/minute")], storage=memory, clock=clock)
    async with client_for(app) as client:
        codes = [(await client.get(path)).status_code
                 for path in ["/search", "/search", "/search", "/v1/search"]]
    assert codes == [200, 200, 429, 200]


async def test_exempt_decorator_and_paths(clock: FakeClock, memory: MemoryStorage) -> None:
    """@exempt endpoints and exempt_paths are never limited and get no headers."""
    app = make_app(ROUTES[:3], tiers=[Tier("t", "1/minute")], storage=memory, clock=clock,
                   exempt_paths=["/static/*"])
    async with client_for(app) as client:
        responses = [await client.get("/health") for _ in range(3)]
        statics = [await client.get("/static/app.js") for _ in range(3)]
        assert (await client.get("/")).status_code == 200
    assert all(r.status_code == 200 and "x-ratelimit-limit" not in r.headers
               for r in responses)
    assert all(r.status_code == 404 for r in statics)


async def test_route_cost(clock: FakeClock, memory: MemoryStorage) -> None:
    """An endpoint with cost 5 uses five units of the tier's limit."""
    app = make_app(ROUTES, tiers=[Tier("t", [Limit("12/minute", "fixed_window")])],
                   storage=memory, clock=clock)
    async with client_for(app) as client:
        first = await client.get("/export")
        second = await client.get("/export")
        third = await client.get("/export")
        cheap = await client.get("/")
    assert first.headers["x-ratelimit-remaining"] == "7"
    assert second.headers["x-ratelimit-remaining"] == "2"
    assert third.status_code == 429
    assert cheap.status_code == 200


def test_cost_larger_than_capacity_fails_at_startup(memory: MemoryStorage) -> None:
    """A route whose cost exceeds a limit's capacity can never pass: refused at start-up."""
    router = Starlette(routes=ROUTES).router
    with pytest.raises(ConfigError, match="could never pass"):
        RateLimitMiddleware(router, tiers=[Tier("t", "3/minute")], storage=memory)


async def test_a_route_added_after_start_up_is_checked_at_its_first_request(
    clock: FakeClock, memory: MemoryStorage, caplog: pytest.LogCaptureFixture,
) -> None:
    """A route the app gains after start-up escapes the start-up check: its first
    request logs the same error, once, and its requests are refused as never
    admissible (not a 500)."""
    app = Starlette(routes=[Route("/", ok)])
    app.add_middleware(RateLimitMiddleware, tiers=[Tier("t", "3/minute")], storage=memory,
                       clock=clock)
    async with client_for(app) as client:
        assert (await client.get("/")).status_code == 200
        app.router.routes.append(Route("/export", export))
        denied = [await client.get("/export") for _ in range(2)]
    assert [response.status_code for response in denied] == [429, 429]
    assert denied[0].json()["retry_after_seconds"] is None
    assert caplog.text.count("route /export costs 5 but limit") == 1


def test_rule_cost_larger_than_capacity_fails_at_startup(memory: MemoryStorage) -> None:
    """The same check covers configured route rules."""
    with pytest.raises(ConfigError, match="could never pass"):
        RateLimitMiddleware(Starlette().router, tiers=[Tier("t", "3/minute")], storage=memory,
                            rules=[RouteRule("/upload", cost=4)])


def _plain() -> object:
    """A fresh endpoint (decorators mark the function itself)."""
    async def endpoint(request: Request) -> Response:
        return PlainTextResponse("ok")
    return endpoint


@pytest.mark.parametrize(("where", "message"), [
    ("tier", "tier 't': limits 'a' (sliding_window 4/minute) and 'b' (sliding_window "
             "4/minute) would count on one counter"),
    ("decorators", "route /p: limits 'y' (sliding_window 3/minute) and 'x' (sliding_window "
                   "3/minute) would count on one counter"),
    ("shadow", "route /p: limits 'y' (sliding_window 3/minute) and 'x' (sliding_window "
               "3/minute) would count on one counter"),
    ("rule", "route /q: limit '3-per-minute' (sliding_window 3/minute) is given twice"),
])
def test_two_limits_on_one_counter_fail_at_startup(
    memory: MemoryStorage, where: str, message: str,
) -> None:
    """A limit's name does not give it a counter of its own: two limits of the same
    algorithm, rate and capacity in one scope (a tier's, an endpoint's, a rule's) would
    each charge the other's counter, and one would vanish from the headers. Refused at
    start-up, naming both, whether or not one of them is a shadow limit."""
    tiers = [Tier("t", "100/minute")]
    routes: list[Route] = []
    rules: list[RouteRule] = []
    if where == "tier":
        tiers = [Tier("t", [Limit("4/minute", name="a"), Limit("4/minute", name="b")])]
    elif where == "rule":
        rules = [RouteRule("/q", limits="3/minute; 3/minute")]
    else:
        endpoint = limit("3/minute", name="x")(
            limit("3/minute", name="y", shadow=where == "shadow")(_plain()))
        routes = [Route("/p", endpoint)]
    with pytest.raises(ConfigError) as failure:
        RateLimitMiddleware(Starlette(routes=routes).router, tiers=tiers, storage=memory,
                            rules=rules)
    assert message in str(failure.value)


async def test_limits_of_one_shape_in_different_scopes_count_apart(
    clock: FakeClock, memory: MemoryStorage,
) -> None:
    """The same rate on the tier and on a route is two counters: no clash."""
    endpoint = limit("3/minute", name="route")(_plain())
    app = make_app([Route("/p", endpoint)], tiers=[Tier("t", "3/minute")], storage=memory,
                   clock=clock, header_style="draft-11")
    async with client_for(app) as client:
        response = await client.get("/p")
    assert response.status_code == 200
    assert response.headers["ratelimit"] == '"3-per-minute";r=2;t=100,"route";r=2;t=100'


async def test_configured_rules_with_methods(clock: FakeClock, memory: MemoryStorage) -> None:
    """A configured pattern limits only the methods it names, shared by matching paths."""
    rule = RouteRule("/items/{id}", frozenset({"POST"}), "1/minute")

    async def item(request: Request) -> Response:
        return PlainTextResponse(request.method)

    routes = [Route("/items/{id}", item, methods=["GET", "POST"])]
    app = make_app(routes, tiers=[Tier("t", "100/minute")], storage=memory, clock=clock,
                   rules=[rule])
    async with client_for(app) as client:
        gets = [(await client.get("/items/1")).status_code for _ in range(3)]
        posts = [(await client.post("/items/1")).status_code,
                 (await client.post("/items/2")).status_code]
    assert gets == [200, 200, 200]
    assert posts == [200, 429]


async def test_a_rule_for_get_covers_head(clock: FakeClock, memory: MemoryStorage) -> None:
    """Starlette answers HEAD with the GET endpoint: a GET rule counts HEAD requests on
    the same counter, so they can't get round it."""
    served = []

    async def search(request: Request) -> Response:
        served.append(request.method)
        return PlainTextResponse("found")

    rule = RouteRule("/search", frozenset({"GET"}), "2/minute")
    app = make_app([Route("/search", search)], tiers=[Tier("t", "100/minute")],
                   storage=memory, clock=clock, rules=[rule])
    async with client_for(app) as client:
        codes = [(await client.head("/search")).status_code for _ in range(2)]
        codes.append((await client.get("/search")).status_code)
        codes.append((await client.head("/search")).status_code)
    assert codes == [200, 200, 429, 429]
    assert served == ["HEAD", "HEAD"]


async def test_a_rules_cost_counts_against_the_tier(
    clock: FakeClock, memory: MemoryStorage,
) -> None:
    """A rule's ``cost`` is the route's cost on the tier's limits (as ``@cost``); each
    request counts 1 on the rule's own limits."""
    rule = RouteRule("/search", limits=[Limit("5/minute", name="search")], cost=2)
    app = make_app([Route("/search", ok)], tiers=[Tier("t", "10/minute")], storage=memory,
                   clock=clock, rules=[rule], header_style="draft-11")
    async with client_for(app) as client:
        response = await client.get("/search")
    assert response.headers["ratelimit"] == '"10-per-minute";r=8;t=100,"search";r=4;t=100'


async def test_rules_from_settings(clock: FakeClock, memory: MemoryStorage) -> None:
    """routes= in settings add limits, costs and exemptions by pattern."""
    app = make_app(tiers=[Tier("t", "100/minute")], storage=memory, clock=clock,
                   routes=[{"path": "/", "limits": "1/minute"},
                           {"path": "/stream", "exempt": True}])
    async with client_for(app) as client:
        assert [(await client.get("/")).status_code for _ in range(2)] == [200, 429]
        assert "x-ratelimit-limit" not in (await client.get("/stream")).headers


async def test_fastapi_decorator_and_dependency(clock: FakeClock, memory: MemoryStorage) -> None:
    """@limit under @app.get and Depends(limit(...)) both limit a FastAPI route."""
    api = FastAPI()

    @api.get("/decorated")
    @limit("1/minute")
    async def decorated() -> dict[str, bool]:
        return {"ok": True}

    @api.get("/dependency", dependencies=[Depends(limit("2/minute"))])
    async def dependency() -> dict[str, bool]:
        return {"ok": True}

    @api.get("/health")
    @exempt
    async def up() -> dict[str, bool]:
        return {"ok": True}

    api.add_middleware(RateLimitMiddleware, tiers=[Tier("t", "100/minute")], storage=memory,
                       clock=clock)
    async with client_for(api) as client:
        decorated_codes = [(await client.get("/decorated")).status_code for _ in range(2)]
        dependency_codes = [(await client.get("/dependency")).status_code for _ in range(3)]
        health = await client.get("/health")
        body = (await client.get("/decorated")).json()
    assert decorated_codes == [200, 429]
    assert dependency_codes == [200, 200, 429]
    assert "x-ratelimit-limit" not in health.headers
    assert body["error"] == "rate_limit_exceeded"


async def test_shadow_route_limit(clock: FakeClock, memory: MemoryStorage) -> None:
    """A route limit marked shadow never blocks."""
    @limit("1/minute", shadow=True)
    async def trial(request: Request) -> Response:
        return PlainTextResponse("ok")

    app = make_app([Route("/trial", trial)], tiers=[Tier("t", "100/minute")], storage=memory,
                   clock=clock)
    async with client_for(app) as client:
        codes = [(await client.get("/trial")).status_code for _ in range(3)]
    assert codes == [200, 200, 200]


def test_limit_rejects_bad_rate() -> None:
    """A bad rate in @limit fails when the module is imported, not per request."""
    with pytest.raises(ConfigError, match="couldn't parse rate"):
        limit("five per fortnight")


def test_rule_needs_absolute_path() -> None:
    """A route pattern must start with '/'."""
    with pytest.raises(ConfigError, match="must start with"):
        RouteRule("items")


async def test_class_endpoint_and_mounted_app(clock: FakeClock, memory: MemoryStorage) -> None:
    """@limit on an HTTPEndpoint method, and on a route of a mounted Starlette app."""
    from starlette.endpoints import HTTPEndpoint

    class Items(HTTPEndpoint):
        @limit("1/minute")
        async def post(self, request: Request) -> Response:
            return PlainTextResponse("made")

        async def get(self, request: Request) -> Response:
            return PlainTextResponse("list")

    sub = Starlette(routes=[Route("/search", search)])
    app = make_app([Route("/items", Items), Mount("/sub", app=sub)],
                   tiers=[Tier("t", "100/minute")], storage=memory, clock=clock)
    async with client_for(app) as client:
        posts = [(await client.post("/items")).status_code for _ in range(2)]
        gets = [(await client.get("/items")).status_code for _ in range(2)]
        subs = [(await client.get("/sub/search")).status_code for _ in range(3)]
    assert posts == [200, 429]
    assert gets == [200, 200]
    assert subs == [200, 200, 429]

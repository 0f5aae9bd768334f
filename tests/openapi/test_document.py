"""document_limits: what a FastAPI app's OpenAPI document says of its limits, and that
the real answers of the app are what it says (checked by schemathesis's own validator)."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
import schemathesis
from fastapi import Depends, FastAPI
from fastapi.responses import PlainTextResponse
from openapi_spec_validator import validate

from ratelimit_mw import (
    IdempotencyMiddleware,
    Limit,
    RateLimitMiddleware,
    RateLimitSettings,
    RedisStorage,
    RouteRule,
    Tier,
    TierFromHeader,
    cost,
    exempt,
    limit,
)
from ratelimit_mw.breaker import CircuitBreaker
from ratelimit_mw.breaker.guard import BreakerGuard, breaker_dependency
from ratelimit_mw.openapi import document_limits
from tests.conftest import free_port

TIERS = [
    Tier("free", [Limit("10/minute", "token_bucket", burst=20, name="burst"),
                  Limit("1000/day", "fixed_window", name="daily")], concurrency=2),
    Tier("pro", [Limit("100/minute", name="minute")], shadow=frozenset({"minute"})),
]
RATE_HEADERS = {
    "legacy": {"X-RateLimit-Limit", "X-RateLimit-Remaining", "X-RateLimit-Reset",
               "X-RateLimit-Policy"},
    "draft-6": {"RateLimit-Limit", "RateLimit-Remaining", "RateLimit-Reset",
                "RateLimit-Policy"},
    "draft-7": {"RateLimit", "RateLimit-Policy"},
    "draft-11": {"RateLimit", "RateLimit-Policy"},
    "none": set(),
}


MIDDLEWARE_ARGUMENTS = {"storage", "tiers", "key", "tier_resolver", "rules", "on_denied",
                        "on_decision", "clock", "breaker"}


def make_app(**options: Any) -> FastAPI:
    """A FastAPI app of limited, marked and exempt routes, documented."""
    app = FastAPI()

    @app.get("/items")
    async def items() -> dict[str, int]:
        return {"n": 1}

    @app.get("/items/{item_id:int}")
    async def item(item_id: int) -> dict[str, int]:
        return {"id": item_id}

    @app.post("/reports", status_code=201)
    @limit("2/minute", name="reports", cost=1)
    async def reports() -> dict[str, str]:
        return {"report": "queued"}

    @app.get("/health")
    @exempt
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/private")
    async def private() -> dict[str, str]:
        return {"private": "yes"}

    settings: dict[str, Any] = {"header_style": "legacy+draft-11", "exempt_paths": ["/private"]}
    arguments: dict[str, Any] = {"tiers": TIERS}
    for name, value in options.items():
        (arguments if name in MIDDLEWARE_ARGUMENTS else settings)[name] = value
    app.add_middleware(RateLimitMiddleware, settings=RateLimitSettings(**settings), **arguments)
    document_limits(app)
    return app


def client_for(app: FastAPI) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test")


def operation(app: FastAPI, path: str, method: str = "get") -> dict[str, Any]:
    return app.openapi()["paths"][path][method]  # type: ignore[no-any-return]


def check_answer(app: FastAPI, path: str, method: str, response: httpx.Response) -> None:
    """The response's status is documented and its body is the documented schema's."""
    document = schemathesis.openapi.from_dict(app.openapi())
    assert str(response.status_code) in operation(app, path, method.lower())["responses"]
    document[path][method.upper()].validate_response(response)


def test_the_document_is_valid_openapi() -> None:
    """openapi-spec-validator takes the document as it is."""
    validate(make_app().openapi())


async def test_a_limited_route_documents_its_429_and_the_429_is_as_documented() -> None:
    """429: the JSON body's schema, the header style's headers and a required
    Retry-After; a real 429 validates against it."""
    app = make_app()
    responses = operation(app, "/items")["responses"]
    assert responses["429"]["content"] == {
        "application/json": {"schema": {"$ref": "#/components/schemas/RateLimitExceeded"}}}
    headers = responses["429"]["headers"]
    assert set(headers) == RATE_HEADERS["legacy"] | RATE_HEADERS["draft-11"] | {"Retry-After"}
    assert app.openapi()["components"]["headers"]["Retry-After"]["required"] is True
    async with client_for(app) as client:
        answers = [await client.get("/items") for _ in range(21)]
    assert [r.status_code for r in answers] == [200] * 20 + [429]
    for response in (answers[0], answers[-1]):
        check_answer(app, "/items", "GET", response)


@pytest.mark.parametrize("style", list(RATE_HEADERS))
async def test_the_documented_headers_are_those_sent(style: str) -> None:
    """On a 200 and on a 429, the rate-limit headers documented are the ones the header
    style sends, no more, no fewer."""
    app = make_app(header_style=style)
    async with client_for(app) as client:
        answers = [await client.get("/items") for _ in range(21)]
    documented = operation(app, "/items")["responses"]
    known = {name.lower() for names in RATE_HEADERS.values() for name in names}
    for response in (answers[0], answers[-1]):
        sent = {name for name in response.headers if name in known}
        listed = set(documented[str(response.status_code)].get("headers", {})) - {"Retry-After"}
        assert sent == {name.lower() for name in listed} == {
            name.lower() for name in RATE_HEADERS[style]}


def test_exempt_routes_get_nothing() -> None:
    """A route marked @exempt, or matched by exempt_paths, is documented as FastAPI
    documents it: no 429, no headers, no x-ratelimit."""
    plain = FastAPI()

    @plain.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @plain.get("/private")
    async def private() -> dict[str, str]:
        return {"private": "yes"}

    app = make_app()
    for path in ("/health", "/private"):
        documented = operation(app, path)
        assert documented == plain.openapi()["paths"][path]["get"]
        assert "x-ratelimit" not in documented


def test_route_limits_and_the_tiers_are_described() -> None:
    """A route's own limits in x-ratelimit and its description; every tier once, in
    x-ratelimit-tiers and as a table in info.description."""
    app = make_app()
    assert operation(app, "/reports", "post")["x-ratelimit"] == {"cost": 1, "limits": [
        {"name": "reports", "rate": "2/minute", "algorithm": "sliding_window", "quota": 2,
         "window": 60}]}
    assert "reports: 2/minute (sliding_window)" in operation(app, "/reports", "post")[
        "description"]
    assert operation(app, "/items")["x-ratelimit"] == {"cost": 1, "limits": []}
    document = app.openapi()
    assert document["x-ratelimit-tiers"] == [
        {"name": "free", "default": True, "concurrency": 2, "limits": [
            {"name": "burst", "rate": "10/minute", "algorithm": "token_bucket", "quota": 20,
             "window": 60, "burst": 20},
            {"name": "daily", "rate": "1000/day", "algorithm": "fixed_window", "quota": 1000,
             "window": 86400}]},
        {"name": "pro", "default": False, "concurrency": None, "limits": [
            {"name": "minute", "rate": "100/minute", "algorithm": "sliding_window",
             "quota": 100, "window": 60, "shadow": True}]},
    ]
    assert ("| free (default) | burst: 10/minute, bursts of 20 (token_bucket); daily: "
            "1000/day (fixed_window) | 2 |") in document["info"]["description"]


def test_a_route_cost_is_described() -> None:
    """@cost: what each request counts against the tier's limits, in x-ratelimit and
    in words."""
    app = FastAPI()

    @app.get("/export")
    @cost(5)
    async def export() -> dict[str, str]:
        return {"export": "queued"}

    app.add_middleware(RateLimitMiddleware, tiers=TIERS)
    document_limits(app)
    assert operation(app, "/export")["x-ratelimit"] == {"cost": 5, "limits": []}
    assert "Each request counts 5." in operation(app, "/export")["description"]


def test_rules_from_configuration_are_described() -> None:
    """A RouteRule's limits are the route's own, like @limit's."""
    app = make_app(rules=[RouteRule("/items/{item_id}", limits="5/second")])
    assert operation(app, "/items/{item_id}")["x-ratelimit"]["limits"] == [
        {"name": "5-per-second", "rate": "5/second", "algorithm": "sliding_window",
         "quota": 5, "window": 1}]


async def test_problem_json_is_documented_when_configured() -> None:
    """response_format='problem+json': the 429 is application/problem+json, as sent."""
    app = make_app(response_format="problem+json", default_limits="1/minute", tiers=None)
    assert operation(app, "/items")["responses"]["429"]["content"] == {
        "application/problem+json": {"schema": {
            "$ref": "#/components/schemas/RateLimitProblem"}}}
    async with client_for(app) as client:
        answers = [await client.get("/items") for _ in range(2)]
    assert answers[-1].headers["content-type"] == "application/problem+json"
    check_answer(app, "/items", "GET", answers[-1])


def test_shadow_mode_documents_headers_but_no_429() -> None:
    """shadow=True never refuses: the headers are documented, the 429 is not."""
    app = make_app(shadow=True)
    responses = operation(app, "/items")["responses"]
    assert "429" not in responses
    assert "X-RateLimit-Remaining" in responses["200"]["headers"]


def test_a_custom_429_is_documented_without_a_body_schema() -> None:
    """With on_denied the body is the app's own: the 429 and its headers, no schema."""
    app = make_app(on_denied=lambda scope, denial: PlainTextResponse("slow down", 429))
    too_many = operation(app, "/items")["responses"]["429"]
    assert "content" not in too_many
    assert "Retry-After" in too_many["headers"]


async def test_failure_mode_closed_documents_its_503_as_sent() -> None:
    """failure_mode='closed': every limited route documents the 503, and a real one
    (a Redis nobody listens on) is as documented."""
    storage = RedisStorage.from_url(f"redis://127.0.0.1:{free_port()}/0", timeout=0.05)
    app = make_app(storage=storage, failure_mode="closed", storage_timeout=0.05)
    try:
        assert "503" in operation(app, "/items")["responses"]
        assert "503" not in operation(app, "/health")["responses"]
        async with client_for(app) as client:
            refused = await client.get("/items")
        assert refused.status_code == 503
        assert refused.json()["error"] == "rate_limit_unavailable"
        check_answer(app, "/items", "GET", refused)
    finally:
        await storage.close()
    assert "503" not in operation(make_app(), "/items")["responses"]  # open: never a 503


async def test_a_breaker_dependency_documents_its_503_as_sent() -> None:
    """A route guarded by breaker_dependency documents the 503; the refusal is the
    library's top-level body, as documented; other routes have no 503."""
    breaker = CircuitBreaker(name="db", window_size=2, minimum_calls=2, cooldown=30)
    app = FastAPI()

    @app.get("/orders", dependencies=[Depends(breaker_dependency(breaker))])
    async def orders() -> dict[str, int]:
        return {"orders": 0}

    @app.get("/ping")
    async def ping() -> dict[str, str]:
        return {"ping": "pong"}

    document_limits(app)
    assert "circuit breaker 'db'" in operation(app, "/orders")["responses"]["503"][
        "description"]
    assert "503" not in operation(app, "/ping")["responses"]
    for _ in range(2):
        breaker.acquire().record_failure()
    async with client_for(app) as client:
        refused = await client.get("/orders")
    assert refused.status_code == 503
    assert refused.json()["circuit"] == "db"
    check_answer(app, "/orders", "GET", refused)


def test_a_breaker_guard_around_the_app_documents_503_everywhere() -> None:
    """BreakerGuard as middleware can refuse any operation: each documents the 503."""
    app = FastAPI()

    @app.get("/a")
    async def a() -> dict[str, str]:
        return {"a": "a"}

    app.add_middleware(BreakerGuard, breaker=CircuitBreaker(name="app"))
    document_limits(app)
    assert "'app'" in operation(app, "/a")["responses"]["503"]["description"]


def idempotent_app() -> FastAPI:
    app = FastAPI()

    @app.post("/payments", status_code=201)
    async def pay(payment: dict[str, Any]) -> dict[str, Any]:
        return {"paid": True, **payment}

    @app.post("/notes", status_code=201)
    async def note() -> dict[str, str]:
        return {"note": "kept"}

    @app.get("/payments")
    async def payments() -> list[str]:
        return []

    app.add_middleware(IdempotencyMiddleware, required=["POST /payments"])
    document_limits(app)
    return app


async def test_idempotency_key_is_declared_and_its_answers_are_as_documented() -> None:
    """Idempotency-Key: required where ``required`` says, optional elsewhere, absent on
    GET; the 400, 422 and a replay are documented as sent, the key echoed."""
    app = idempotent_app()
    key = {"Idempotency-Key": "0d9e6a0c-5b0f-4c39-9d43-8c4a1e6f0f7b"}
    [required] = operation(app, "/payments", "post")["parameters"]
    assert (required["name"], required["in"], required["required"]) == (
        "Idempotency-Key", "header", True)
    assert operation(app, "/notes", "post")["parameters"][0]["required"] is False
    assert "parameters" not in operation(app, "/payments")
    created = operation(app, "/payments", "post")["responses"]["201"]["headers"]
    assert {"Idempotency-Key", "X-Idempotent-Replayed"} <= set(created)
    async with client_for(app) as client:
        missing = await client.post("/payments", json={"amount": 1})
        first = await client.post("/payments", json={"amount": 1}, headers=key)
        replay = await client.post("/payments", json={"amount": 1}, headers=key)
        reused = await client.post("/payments", json={"amount": 2}, headers=key)
    assert [r.status_code for r in (missing, first, replay, reused)] == [400, 201, 201, 422]
    assert replay.headers["x-idempotent-replayed"] == "true"
    for response in (missing, first, replay, reused):
        check_answer(app, "/payments", "POST", response)
    for response in (first, replay, reused):
        assert response.headers["idempotency-key"] == key["Idempotency-Key"]


@pytest.mark.parametrize("value", ['"quoted-key"', "  padded  ", "k" * 255, "a\"b"])
def test_the_key_pattern_takes_what_the_middleware_takes(value: str) -> None:
    """The documented Idempotency-Key pattern admits keys the middleware admits."""
    import re

    from ratelimit_mw.idempotency import parse_idempotency_key

    parse_idempotency_key([value])
    pattern = operation(idempotent_app(), "/payments", "post")["parameters"][0]["schema"][
        "pattern"]
    assert re.fullmatch(pattern, value)


@pytest.mark.parametrize("value", ["", "   ", "k" * 256, '"open', '""', "tab\there"])
def test_the_key_pattern_refuses_what_the_middleware_refuses(value: str) -> None:
    """...and refuses the keys the middleware answers with 400."""
    import re

    from ratelimit_mw.idempotency import InvalidKeyError, parse_idempotency_key

    with pytest.raises(InvalidKeyError):
        parse_idempotency_key([value])
    pattern = operation(idempotent_app(), "/payments", "post")["parameters"][0]["schema"][
        "pattern"]
    assert not re.fullmatch(pattern, value)


def test_a_new_route_gets_described_too() -> None:
    """A document made anew after the routes change is described again."""
    app = make_app()
    assert "429" in operation(app, "/items")["responses"]

    @app.get("/later")
    async def later() -> dict[str, str]:
        return {"later": "yes"}

    app.openapi_schema = None  # FastAPI 0.137 notices the new route; before, it is told
    assert "429" in operation(app, "/later")["responses"]
    assert app.openapi() is app.openapi()  # and described once
    document_limits(app)  # twice: still described once
    assert app.openapi()["info"]["description"].count("## Rate limits") == 1
    assert operation(app, "/later")["description"].count("Rate limited") == 1


def test_a_tier_header_app_and_an_app_without_the_middleware() -> None:
    """The tiers a header picks are described like any; an app with neither middleware
    gets a warning and its document unchanged."""
    app = make_app(tier_resolver=TierFromHeader("x-plan"))
    assert [tier["name"] for tier in app.openapi()["x-ratelimit-tiers"]] == ["free", "pro"]
    bare = FastAPI()

    @bare.get("/x")
    async def x() -> dict[str, str]:
        return {"x": "x"}

    expected = FastAPI.openapi(bare)
    bare.openapi_schema = None
    document_limits(bare)
    assert bare.openapi()["paths"] == expected["paths"]


def test_document_limits_needs_a_fastapi_app() -> None:
    """A Starlette app has no OpenAPI document: a TypeError that says so."""
    from starlette.applications import Starlette

    with pytest.raises(TypeError, match="needs a FastAPI app"):
        document_limits(Starlette())  # type: ignore[arg-type]

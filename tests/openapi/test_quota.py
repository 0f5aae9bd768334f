"""document_limits and the quota endpoints: FastAPI leaves ``quota_router``'s plain routes
out of its document, so the openapi package adds them; real answers match them."""

from __future__ import annotations

from typing import Any

import httpx
import schemathesis
from fastapi import FastAPI
from openapi_spec_validator import validate
from starlette.responses import JSONResponse
from starlette.routing import Route

from example_app.main import app as example_app
from ratelimit_mw import (
    Limit,
    RateLimitMiddleware,
    RateLimitSettings,
    RedisStorage,
    Tier,
    TierFromHeader,
    quota_router,
)
from ratelimit_mw.openapi import document_limits
from tests.conftest import free_port
from tests.example_app.conftest import PRO

QUOTA = "/api/v1/account/quota"
HISTORY = f"{QUOTA}/history"
PLAN = {"X-Tier": "pro", "X-API-Key": "k1"}


def make_app(prefix: str = "", **settings: Any) -> FastAPI:
    """A FastAPI app with the quota routes under ``prefix``, documented."""
    app = FastAPI()
    app.include_router(quota_router(), prefix=prefix)
    storage = settings.pop("storage", None)
    app.add_middleware(
        RateLimitMiddleware, settings=RateLimitSettings(key="api_key", **settings),
        tiers=[Tier("free", [Limit("10/minute", name="minute")]),
               Tier("pro", [Limit("100/minute", "token_bucket", burst=20, name="burst"),
                            Limit("1000/day", name="daily")], concurrency=3)],
        tier_resolver=TierFromHeader("x-tier"), **({"storage": storage} if storage else {}))
    document_limits(app)
    return app


def answers(app: FastAPI, path: str) -> dict[str, Any]:
    return app.openapi()["paths"][path]["get"]["responses"]  # type: ignore[no-any-return]


def check_answer(app: FastAPI, path: str, response: httpx.Response) -> None:
    """The status is documented and the body is the documented schema's."""
    assert str(response.status_code) in answers(app, path)
    schemathesis.openapi.from_dict(app.openapi())[path]["GET"].validate_response(response)


async def get(app: FastAPI, path: str, headers: dict[str, str] | None = None,
              params: dict[str, str] | None = None) -> httpx.Response:
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        return await client.get(path, headers=headers, params=params)


def test_both_operations_are_documented_with_their_answers() -> None:
    """GET quota and GET quota/history, tagged ``quota``, with 200, their errors and the
    rate limiter's 429; the rate-limit headers on the 200; a valid document."""
    app = make_app(header_style="draft-11")
    document = app.openapi()
    validate(document)
    quota, history = document["paths"][QUOTA]["get"], document["paths"][HISTORY]["get"]
    assert quota["tags"] == history["tags"] == ["quota"]
    assert quota["summary"] == "Your plan, limits and usage"
    assert history["summary"] == "Your usage per hour or day"
    assert set(quota["responses"]) == {"200", "401", "429", "503"}
    assert set(history["responses"]) == {"200", "400", "401", "404", "429", "503"}
    assert {p["name"] for p in history["parameters"]} == {"granularity", "from", "to"}
    assert {"RateLimit", "RateLimit-Policy"} <= set(quota["responses"]["200"]["headers"])
    codes = {status: answer["content"]["application/json"]["schema"]["properties"]["error"]
             ["enum"] for status, answer in history["responses"].items()
             if status in {"400", "401", "404", "503"}}
    assert codes == {"400": ["bad_request"], "401": ["unauthorized"],
                     "404": ["quota_history_disabled"], "503": ["quota_unavailable"]}
    assert quota["x-ratelimit"] == {"cost": 1, "limits": []}


def test_the_operations_are_where_the_router_is_included() -> None:
    """Under an ``include_router`` prefix, at the prefixed paths only."""
    paths = make_app(prefix="/v2").openapi()["paths"]
    assert {f"/v2{QUOTA}", f"/v2{HISTORY}"} <= set(paths)
    assert QUOTA not in paths
    assert paths[f"/v2{QUOTA}"]["get"]["operationId"] != paths[f"/v2{HISTORY}"]["get"][
        "operationId"]


def test_a_route_of_the_app_named_like_a_quota_route_is_left_alone() -> None:
    """Only quota_router's own endpoints are described: the app's route of the same
    name stays out of the document, as FastAPI left it."""
    app = FastAPI()

    async def mine(request: object) -> JSONResponse:
        return JSONResponse({})

    app.router.routes.append(Route("/mine", mine, name="account_quota"))
    app.add_middleware(RateLimitMiddleware, settings=RateLimitSettings(
        default_limits="5/minute"))
    document_limits(app)
    assert "/mine" not in app.openapi()["paths"]


async def test_the_example_apps_answers_are_as_documented() -> None:
    """The example app (memory storage): 200 with a demo key, 401 without, the
    history's 200 and 400, each valid against the document."""
    ok = await get(example_app, QUOTA, PRO)
    assert ok.status_code == 200
    assert {"plan", "period", "limits", "usage", "resets_at", "burst", "concurrency"} <= set(
        ok.json())
    check_answer(example_app, QUOTA, ok)
    anonymous = await get(example_app, QUOTA)
    assert anonymous.status_code == 401
    check_answer(example_app, QUOTA, anonymous)
    history = await get(example_app, HISTORY, PRO, {"granularity": "hour"})
    assert history.status_code == 200
    assert history.json()["total"] >= 0
    check_answer(example_app, HISTORY, history)
    bad = await get(example_app, HISTORY, PRO, {"from": "yesterday"})
    assert bad.status_code == 400
    check_answer(example_app, HISTORY, bad)


async def test_history_off_answers_the_documented_404() -> None:
    """quota_history off: the history's 404 validates, and the quota's 200 too (with
    its month counted by no history: ``requests_today`` from the daily limit)."""
    app = make_app(quota_history=False)
    off = await get(app, HISTORY, PLAN)
    assert off.status_code == 404
    assert off.json()["error"] == "quota_history_disabled"
    check_answer(app, HISTORY, off)
    ok = await get(app, QUOTA, PLAN)
    assert ok.status_code == 200
    assert ok.json()["limits"] == {"requests_per_minute": 100, "requests_per_day": 1000}
    check_answer(app, QUOTA, ok)


async def test_a_storage_that_cant_be_read_answers_the_documented_503() -> None:
    """A Redis nobody listens on: the quota's 503 (``quota_unavailable``, Retry-After)
    validates against the document."""
    storage = RedisStorage.from_url(f"redis://127.0.0.1:{free_port()}/0", timeout=0.05)
    app = make_app(storage=storage, storage_timeout=0.05, exempt_paths=[QUOTA])
    try:
        refused = await get(app, QUOTA, PLAN)
    finally:
        await storage.close()
    assert refused.status_code == 503
    assert refused.json()["error"] == "quota_unavailable"
    assert "Retry-After" in answers(app, QUOTA)["503"]["headers"]
    check_answer(app, QUOTA, refused)

"""Starlette apps (no FastAPI, no OpenAPI document) keep working as they did, with the
library's one body shape and the echoed Idempotency-Key."""

from __future__ import annotations

import subprocess
import sys
import textwrap

CODE = textwrap.dedent('''
    import asyncio, sys
    sys.modules["fastapi"] = None  # FastAPI is not installed, as far as this app knows

    import httpx
    from starlette.applications import Starlette
    from starlette.middleware import Middleware
    from starlette.responses import JSONResponse
    from starlette.routing import Mount, Route

    from ratelimit_mw import (IdempotencyMiddleware, RateLimitMiddleware, RateLimitSettings,
                              quota_router)
    from ratelimit_mw.breaker import CircuitBreaker
    from ratelimit_mw.breaker.guard import BreakerGuard

    async def pay(request):
        return JSONResponse({"paid": True}, status_code=201)

    breaker = CircuitBreaker(name="db", window_size=2, minimum_calls=2, cooldown=30)
    app = Starlette(
        routes=[Route("/pay", pay, methods=["POST"]),
                Mount("/db", app=BreakerGuard(Starlette(routes=[Route("/", pay)]), breaker)),
                *quota_router().routes],
        middleware=[Middleware(RateLimitMiddleware,
                               settings=RateLimitSettings(default_limits="3/minute")),
                    Middleware(IdempotencyMiddleware, required=["/pay"])])

    async def main():
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            paid = await client.post("/pay", headers={"Idempotency-Key": "k1"})
            for _ in range(2):
                breaker.acquire().record_failure()
            refused = await client.get("/db/")
            quota = await client.get("/api/v1/account/quota")
            limited = await client.post("/pay", headers={"Idempotency-Key": "k2"})
        assert (paid.status_code, paid.headers["idempotency-key"]) == (201, "k1")
        assert refused.status_code == 503, refused.text
        assert set(refused.json()) >= {"error", "message", "retry_after_seconds", "circuit"}
        assert limited.status_code == 429
        assert set(limited.json()) >= {"error", "message", "retry_after_seconds"}
        assert quota.json()["error"] == "unauthorized", quota.text  # served, not a 404
        assert "fastapi" not in [m for m in sys.modules if sys.modules[m] is not None]

    asyncio.run(main())
''')


def test_a_starlette_app_without_fastapi_works_unchanged() -> None:
    """Rate limits, idempotency, a breaker and the quota routes on a plain Starlette app,
    FastAPI not importable: the 429 and 503 bodies are top-level, the key is echoed."""
    result = subprocess.run([sys.executable, "-W", "error", "-c", CODE], capture_output=True,
                            text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stderr[-3000:]

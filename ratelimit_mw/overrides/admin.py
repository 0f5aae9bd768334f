"""The admin API: list, read, set and delete overrides and blocks; reset counters.

Mount it behind ``RateLimitMiddleware`` given ``overrides=`` (it acts on that
middleware's overrides and storage)::

    app.include_router(admin_router())                    # FastAPI
    app = Starlette(routes=[*admin_router().routes])      # Starlette

Every call needs ``Authorization: Bearer <token>``, the token being
``RATELIMIT_ADMIN_TOKEN`` (or ``token=``); without one the router is not made. Failed
authentications are limited per client address (``auth_failures``, 10 a minute by
default) and logged with it (``failed_auth.py``).

- ``GET {path}/overrides``: every override (``?blocked=true``: blocks only).
- ``PUT {path}/overrides``: set one; the body names the ``caller`` and one of
  ``tier``, ``limits`` (with ``concurrency``, ``plan``), ``blocked_until`` or
  ``block_for`` (seconds); optionally ``expires_at`` or ``expires_in`` and a ``reason``.
- ``GET`` / ``DELETE {path}/overrides/{caller}``: one override, or remove it.
- ``POST {path}/counters/{caller}/reset``: forget the caller's counters.

A caller is written ``api_key:SECRET``, ``user:ID``, ``ip:ADDRESS``,
``network:CIDR`` or ``key:KEY`` (see ``caller_key``). Bad input is a 422 naming the
field; each change is one structured log line (who, what, before, after).
"""

from __future__ import annotations

import hmac
import json
import math
from datetime import UTC, datetime
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route, Router

from ..errors import ConfigError, StorageError
from ..limiter import Limiter, limiter_of
from ..responses import error_response
from ..settings import RateLimitSettings
from .failed_auth import FailedAuth
from .model import Override, OverrideError, caller_key, limits_from_json
from .view import Overrides

__all__ = ["ADMIN_PATH", "AdminEndpoints", "admin_router"]

ADMIN_PATH = "/admin/ratelimit"
MIN_TOKEN = 16
_MAX_BODY = 16_384
_FIELDS = frozenset({"caller", "tier", "limits", "concurrency", "plan", "blocked_until",
                     "block_for", "expires_at", "expires_in", "reason"})


def _invalid(field: str, message: str) -> JSONResponse:
    return error_response(422, "invalid_request", f"{field}: {message}", field=field)


def _time(value: object, field: str) -> float:
    """Epoch seconds from a number or an ISO 8601 date-time (``2026-12-03T10:00:00Z``)."""
    if isinstance(value, bool):
        raise OverrideError(field, "expected epoch seconds or an ISO 8601 time")
    if isinstance(value, int | float):
        number = float(value)
    elif isinstance(value, str) and len(value) <= 40:
        try:
            moment = datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
        except ValueError:
            raise OverrideError(field, f"couldn't read {value!r}; expected e.g. "
                                       f"'2026-12-03T10:00:00Z' or epoch seconds") from None
        if moment.tzinfo is None:
            moment = moment.replace(tzinfo=UTC)
        number = moment.timestamp()
    else:
        raise OverrideError(field, "expected epoch seconds or an ISO 8601 time")
    if not math.isfinite(number):
        raise OverrideError(field, "expected a finite time")
    return number


def _seconds(value: object, field: str) -> float:
    if (isinstance(value, bool) or not isinstance(value, int | float)
            or not math.isfinite(value) or not 0 < value <= 10 * 365 * 86400):
        raise OverrideError(field, "a number of seconds from 0 to ten years")
    return float(value)


def override_from_body(data: object, *, now: float, by: str) -> Override:
    """The override a ``PUT`` body describes (an OverrideError naming a bad field)."""
    if not isinstance(data, dict):
        raise OverrideError("body", "expected a JSON object")
    unknown = sorted(set(data) - _FIELDS)
    if unknown:
        raise OverrideError(unknown[0][:40] or '""', f"unknown field; expected {sorted(_FIELDS)}")
    if "caller" not in data:
        raise OverrideError("caller", "required")
    caller = caller_key(data["caller"])
    blocked_until = data.get("blocked_until")
    if blocked_until is not None:
        blocked_until = _time(blocked_until, "blocked_until")
    if data.get("block_for") is not None:
        if blocked_until is not None:
            raise OverrideError("block_for", "give blocked_until or block_for, not both")
        blocked_until = now + _seconds(data["block_for"], "block_for")
    expires_at = data.get("expires_at")
    if expires_at is not None:
        expires_at = _time(expires_at, "expires_at")
    if data.get("expires_in") is not None:
        if expires_at is not None:
            raise OverrideError("expires_in", "give expires_at or expires_in, not both")
        expires_at = now + _seconds(data["expires_in"], "expires_in")
    limits = data.get("limits")
    if limits is not None and not isinstance(limits, list | str):
        raise OverrideError("limits", "expected a rate string or a list of limits")
    if isinstance(limits, list):
        limits = limits_from_json(limits)
    concurrency = data.get("concurrency")
    plan = data.get("plan", "custom")
    reason = data.get("reason", "")
    return Override(caller, tier=data.get("tier"), limits=limits or (),
                    concurrency=concurrency, plan=plan, blocked_until=blocked_until,
                    expires_at=expires_at, reason=reason, set_by=by, set_at=round(now, 3))


class AdminEndpoints:
    """The admin handlers, as Starlette endpoints, behind a bearer token."""

    __slots__ = ("_failures", "_token")

    def __init__(self, token: str | None = None, *,
                 settings: RateLimitSettings | None = None,
                 auth_failures: str = "10/minute") -> None:
        if token is None:
            secret = (settings if settings is not None else RateLimitSettings()).admin_token
            token = secret.get_secret_value() if secret is not None else None
        if not token:
            msg = ("the overrides admin API needs a bearer token: set RATELIMIT_ADMIN_TOKEN "
                   "(or pass token=); without one it is not mounted")
            raise ConfigError(msg)
        if len(token) < MIN_TOKEN or not token.isascii() or not token.isprintable():
            msg = (f"RATELIMIT_ADMIN_TOKEN must be at least {MIN_TOKEN} printable ASCII "
                   f"characters (e.g. from `python -c 'import secrets; "
                   f"print(secrets.token_urlsafe())'`)")
            raise ConfigError(msg)
        self._token = token.encode("ascii")
        self._failures = FailedAuth(auth_failures)

    def _authorized(self, request: Request) -> bool:
        sent = request.headers.get("authorization", "")
        scheme, _, value = sent.partition(" ")
        if scheme.lower() != "bearer":
            return False
        return hmac.compare_digest(value.strip().encode("latin-1", "replace"), self._token)

    @staticmethod
    def _who(request: Request) -> str:
        user = request.headers.get("x-admin-user", "")[:64]
        user = "".join(c for c in user if c.isprintable()) or "admin"
        client = request.client.host if request.client else "-"
        return f"{user}@{client}"

    @staticmethod
    def _limiter(request: Request) -> Limiter:
        limiter = limiter_of(request.scope)
        if limiter is None or limiter.overrides is None:
            msg = ("the admin API needs RateLimitMiddleware given overrides= in front of it "
                   "(app.add_middleware(RateLimitMiddleware, overrides=Overrides(...)))")
            raise RuntimeError(msg)
        return limiter

    async def overrides(self, request: Request) -> Response:
        """``GET`` (list) and ``PUT`` (set) ``…/overrides``."""
        return await self._guarded(request, None)

    async def override(self, request: Request) -> Response:
        """``GET`` and ``DELETE`` ``…/overrides/{caller}``."""
        return await self._guarded(request, request.path_params["caller"])

    async def reset(self, request: Request) -> Response:
        """``POST …/counters/{caller}/reset``."""
        return await self._guarded(request, request.path_params["caller"], reset=True)

    async def _guarded(self, request: Request, caller: str | None, *,
                       reset: bool = False) -> Response:
        """Check the token, then run the handler; a bad field is a 422, a storage
        that can't answer a 503."""
        limiter = self._limiter(request)
        gate = await self._failures.enter(request, limiter)
        if gate.refused:
            return error_response(
                429, "too_many_failed_authentications",
                "Too many failed authentications from this address; try again later.",
                headers={"Retry-After": str(gate.retry_after)},
                retry_after_seconds=gate.retry_after)
        if not self._authorized(request):
            self._failures.failed(request)
            return error_response(401, "unauthorized", "Send Authorization: Bearer <token>.",
                                  headers={"WWW-Authenticate": 'Bearer realm="ratelimit-admin"'})
        await self._failures.passed(gate, limiter)
        overrides = limiter.overrides
        assert overrides is not None  # _limiter checked it
        try:
            if caller is not None:
                caller = caller_key(caller)
                if reset:
                    return await self._reset(request, caller)
                if request.method == "DELETE":
                    return await self._delete(request, overrides, caller)
                return await self._get(overrides, caller)
            if request.method == "PUT":
                return await self._set(request, overrides)
            return await self._list(request, overrides)
        except OverrideError as exc:
            return _invalid(exc.field, exc.message)
        except (StorageError, TimeoutError):
            return error_response(503, "overrides_unavailable",
                                  "The overrides can't be reached right now; try again.",
                                  headers={"Retry-After": "1"})

    async def _list(self, request: Request, overrides: Overrides) -> Response:
        items = await overrides.all()
        if request.query_params.get("blocked", "").lower() in ("1", "true", "yes"):
            items = [item for item in items if item.blocks]
        return JSONResponse({"overrides": [item.to_dict() for item in items]},
                            headers={"Cache-Control": "no-store"})

    async def _get(self, overrides: Overrides, caller: str) -> Response:
        found = await overrides.get(caller)
        if found is None:
            return error_response(404, "not_found", f"No override for {caller}.")
        return JSONResponse(found.to_dict(), headers={"Cache-Control": "no-store"})

    async def _set(self, request: Request, overrides: Overrides) -> Response:
        body = await request.body()
        if len(body) > _MAX_BODY:
            raise OverrideError("body", f"at most {_MAX_BODY} bytes")
        try:
            data: Any = json.loads(body)
        except (ValueError, RecursionError):
            raise OverrideError("body", "not valid JSON") from None
        override = override_from_body(data, now=overrides.clock(), by=self._who(request))
        before = await overrides.set(override, by=override.set_by)
        return JSONResponse({"override": override.to_dict(),
                             "replaced": before.to_dict() if before is not None else None},
                            headers={"Cache-Control": "no-store"})

    async def _delete(self, request: Request, overrides: Overrides, caller: str) -> Response:
        before = await overrides.delete(caller, by=self._who(request))
        if before is None:
            return error_response(404, "not_found", f"No override for {caller}.")
        return JSONResponse({"deleted": before.to_dict()}, headers={"Cache-Control": "no-store"})

    async def _reset(self, request: Request, caller: str) -> Response:
        limiter = self._limiter(request)
        overrides = limiter.overrides
        assert overrides is not None  # _limiter checked it
        await overrides.reset(caller, lambda: limiter.read(lambda: limiter.storage.reset(caller)),
                              by=self._who(request))
        return JSONResponse({"reset": caller}, headers={"Cache-Control": "no-store"})


def admin_router(path: str = ADMIN_PATH, *, token: str | None = None,
                 settings: RateLimitSettings | None = None,
                 auth_failures: str = "10/minute") -> Router:
    """A router with the admin endpoints (a ConfigError without a token).

    FastAPI: ``app.include_router(admin_router())`` (it is then a FastAPI
    ``APIRouter``); Starlette: ``Starlette(routes=[*admin_router().routes])``. The
    routes are plain Starlette routes, so they serve in either app (and stay out of
    FastAPI's OpenAPI schema, like the quota endpoints).
    """
    endpoints = AdminEndpoints(token, settings=settings, auth_failures=auth_failures)
    routes = [
        Route(f"{path}/overrides", endpoints.overrides, methods=["GET", "PUT"],
              name="ratelimit_admin_overrides"),
        Route(f"{path}/overrides/{{caller:path}}", endpoints.override,
              methods=["GET", "DELETE"], name="ratelimit_admin_override"),
        Route(f"{path}/counters/{{caller:path}}/reset", endpoints.reset, methods=["POST"],
              name="ratelimit_admin_reset"),
    ]
    try:
        from fastapi import APIRouter
    except ImportError:  # a Starlette app: FastAPI is an optional extra
        return Router(routes=routes)
    return APIRouter(routes=list(routes))

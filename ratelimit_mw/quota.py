"""Quota endpoints: each caller's own plan, limits, usage and usage history.

Mount them behind `RateLimitMiddleware` (they ask its limiter who the caller is, so
they resolve identity exactly as the limits do)::

    app.include_router(quota_router())                    # FastAPI
    app = Starlette(routes=[*quota_router().routes])     # Starlette

``GET /api/v1/account/quota``::

    {"plan": "pro", "period": "2024-01",
     "limits": {"requests_per_minute": 1000, "requests_per_day": 500000},
     "usage": {"requests_today": 12345, "requests_this_minute": 234},
     "resets_at": "2024-02-01T00:00:00Z"}

How the numbers are computed (all for the caller's key, on the middleware's storage):

- ``limits``: one ``requests_per_<period>`` entry per rate limit of the tier (the
  sustained amount; the smallest if two share a period). Only when the tier has
  them: ``burst`` (``{"requests_per_minute": 20}``: the burst of a token bucket or
  GCRA) and ``concurrency`` (``{"limit": 2, "in_flight": 1}``, this request included).
- ``requests_today``: the usage-history bucket of the current UTC day (admitted
  requests in units, as the limits count them: a route of cost 5 counts 5; counted
  in the same atomic call that decided them; needs
  ``quota_history``); without history, what the tier's per-day limit counts
  (``limit - remaining`` of a read-only peek); ``null`` if neither exists.
- ``requests_this_minute``: what the tier's per-minute limit counts right now, by a
  read-only peek: ``limit - remaining``. For a fixed window that is the requests of
  this clock minute; for a sliding log, of the last 60 s; for a sliding-window
  counter, its weighted estimate; for a token bucket or GCRA, the burst spent and not
  yet refilled. ``null`` when the tier has no per-minute limit.
- ``requests_this_month`` (only when the tier has a monthly limit, e.g.
  ``Limit.monthly``): what that limit counts (exact for a calendar month).
- A limit of another unit (``unit="tokens"``) is reported under its unit:
  ``tokens_per_minute`` in ``limits``, ``tokens_this_minute`` in ``usage`` (what it
  counts now, settled charges included, by the same peek).
- ``period`` is the current UTC calendar month and ``resets_at`` the start of the
  next one (when monthly quotas reset).

``GET /api/v1/account/quota/history?granularity=hour|day&from=…&to=…``: admitted
requests (in units) per UTC hour or day bucket, and where the tier limits other units
(tokens), what they spent of each (``"tokens"`` per bucket, ``"total_tokens"``),
settled charges included; ``from``/``to`` are ISO dates (``2024-01-31``,
a date-only ``to`` meaning the end of that day), ISO date-times or epoch seconds.
Default range: the last 24 hours (hour) or 30 days (day). Buckets older than the
retention (``usage_retention_hours``/``_days``) are not reported.

A request the middleware can't attribute, or (unless ``allow_anonymous``) one known
only by its client IP, gets 401: quotas belong to accounts.
"""

from __future__ import annotations

import logging
import math
from datetime import UTC, date, datetime, timedelta
from functools import partial
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route, Router

from .decision import Decision
from .errors import StorageError, describe_error
from .identity import Caller
from .limiter import Limiter, limiter_of
from .responses import error_response, iso_utc
from .storage.base import BUCKET_SECONDS, Granularity

__all__ = ["quota_router"]

QUOTA_PATH = "/api/v1/account/quota"
_UNITS = {1: "second", 60: "minute", 3600: "hour", 86400: "day", 30 * 86400: "month"}
# (``N/month`` is 30 days as a rate; a ``Limit.monthly`` counts calendar months.)
_DEFAULT_SPAN = {"hour": 24 * 3600, "day": 30 * 86400}


def _unit(limit_period: float) -> str:
    seconds = round(limit_period)
    return _UNITS.get(seconds, f"{limit_period:g}s")


_log = logging.getLogger("ratelimit_mw")


def _unavailable(what: str, limiter: Limiter, exc: BaseException) -> Response:
    """The 503 for a read that failed; the cause (which may name the storage's address)
    goes to the log, not to the caller."""
    retry = limiter.retry_after
    error = describe_error(exc)
    _log.warning("ratelimit_mw quota read failed: event=quota_unavailable error=%s", error,
                 extra={"ratelimit": {"event": "quota_unavailable", "error": error}})
    return error_response(503, "quota_unavailable",
                          f"{what} can't be read right now; try again in {retry}s.",
                          headers={"Retry-After": str(retry)})


_SKEW = 2 * 86400
"""How far an app server's clock may be off the storage's for the quota report."""


def _month(now: float) -> tuple[str, float, float]:
    """The UTC month of ``now``: its label, start and the start of the next one."""
    day = datetime.fromtimestamp(now, UTC)
    start = datetime(day.year, day.month, 1, tzinfo=UTC)
    after = datetime(day.year + day.month // 12, day.month % 12 + 1, 1, tzinfo=UTC)
    return f"{day.year:04d}-{day.month:02d}", start.timestamp(), after.timestamp()


class _BadParameterError(ValueError):
    """A query parameter that can't be understood."""


def _when(value: str, name: str, *, end: bool) -> float:
    """Epoch seconds from ``1706745600``, ``2024-02-01`` or ``2024-02-01T10:00:00Z``."""
    text = value.strip()
    try:
        number = float(text)
    except ValueError:
        pass
    else:
        return _in_range(number, value, name)
    try:
        if len(text) == 10:
            day = date.fromisoformat(text)
            moment = datetime(day.year, day.month, day.day, tzinfo=UTC)
            if end:  # a date-only end means the whole of that day
                moment += timedelta(days=1, microseconds=-1)
        else:
            moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError as exc:
        msg = (f"couldn't read {name}={value[:40]!r}; expected an ISO date (2024-01-31), "
               f"an ISO date-time (2024-01-31T10:00:00Z) or epoch seconds")
        raise _BadParameterError(msg) from exc
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return _in_range(moment.timestamp(), value, name)


def _in_range(epoch: float, value: str, name: str) -> float:
    """``epoch``, if it lies from 1970 to the end of year 9999 (UTC)."""
    if not math.isfinite(epoch) or not 0 <= epoch < 253402300800:
        msg = f"{name}={value[:40]!r} is out of range (1970 to 9999, UTC)"
        raise _BadParameterError(msg)
    return epoch


class _QuotaEndpoints:
    """The two quota handlers (``quota`` and ``history``), as Starlette endpoints.

    ``allow_anonymous``: let callers known only by their IP see their quota too.
    """

    __slots__ = ("allow_anonymous",)

    def __init__(self, *, allow_anonymous: bool = False) -> None:
        self.allow_anonymous = allow_anonymous

    async def _caller(self, request: Request) -> tuple[Limiter, Caller | None]:
        limiter = limiter_of(request.scope)
        if limiter is None:
            msg = ("the quota endpoints need RateLimitMiddleware in front of them "
                   "(app.add_middleware(RateLimitMiddleware, ...))")
            raise RuntimeError(msg)
        caller = await limiter.identify(request.scope)
        if caller is None or (caller.anonymous and not self.allow_anonymous):
            return limiter, None
        return limiter, caller

    @staticmethod
    def _unauthorized() -> JSONResponse:
        return error_response(401, "unauthorized", "Send a valid API key to see your quota.",
                              headers={"WWW-Authenticate": 'ApiKey realm="api"'})

    async def quota(self, request: Request) -> Response:
        """``GET …/quota``: the caller's plan, limits, usage and when the period resets."""
        limiter, caller = await self._caller(request)
        if caller is None:
            return self._unauthorized()
        limit_set = limiter.limit_set_for(caller.tier, caller.key)
        # The tier's limits of other units (tokens) are charged only where a route
        # spends them, so a route-less set leaves them out: read them too.
        hits = (*limit_set.hits, *(hit for hit in limit_set.tier.hits
                                   if hit.limit.unit != "requests"))
        now = limiter.clock()
        storage = limiter.storage
        try:
            peek = await limiter.read(lambda: storage.peek(caller.key, hits)) if hits else None
            today: int | None = None
            if limiter.settings.quota_history:
                # Days around ours: the storage stops at its own today (Redis's clock),
                # which an app server's skewed clock could put a day off.
                days = await limiter.read(lambda: storage.usage(
                    caller.key, "day", now - _SKEW, now + _SKEW))
                today = days[-1][1] if days else 0
        except (StorageError, TimeoutError) as exc:
            return _unavailable("The quota", limiter, exc)
        if peek is not None and peek.at is not None:
            now = peek.at  # the storage's clock: app servers agree on the period
        label, _, month_end = _month(now)
        report = _Report()
        for decision in peek.decisions if peek is not None else ():
            # A route's own limits are not the tier's; a shadow limit is only
            # being tried out, and holds nobody back.
            if not decision.scope and (decision.scope, decision.limit) not in limit_set.shadow:
                report.add(decision)
        usage: dict[str, int | None] = {
            "requests_today": (today if today is not None
                               else report.counted.get(("requests", "day"))),
            "requests_this_minute": report.counted.get(("requests", "minute")),
        }
        for (unit, period), used in report.counted.items():
            if unit != "requests":
                usage[f"{unit}_this_{period}"] = used
        if ("requests", "month") in report.counted:
            usage["requests_this_month"] = report.counted["requests", "month"]
        body: dict[str, Any] = {
            "plan": caller.tier.name,
            "period": label,
            "limits": report.limits,
            "usage": usage,
            "resets_at": iso_utc(month_end),
        }
        if report.burst:
            body["burst"] = report.burst
        if report.concurrency is not None:
            body["concurrency"] = report.concurrency
        return JSONResponse(body, headers={"Cache-Control": "no-store"})

    async def history(self, request: Request) -> Response:
        """``GET …/quota/history``: admitted requests per hour or day bucket."""
        limiter, caller = await self._caller(request)
        if caller is None:
            return self._unauthorized()
        if not limiter.settings.quota_history:
            return error_response(404, "quota_history_disabled",
                          "Usage history is not recorded here (quota_history is off).")
        params = request.query_params
        granularity = params.get("granularity", "day").strip().lower()
        if granularity not in BUCKET_SECONDS:
            return error_response(400, "bad_request", "granularity must be 'hour' or 'day'")
        now = limiter.clock()
        try:
            end = _when(params["to"], "to", end=True) if "to" in params else now
            start = (_when(params["from"], "from", end=False) if "from" in params
                     else end - _DEFAULT_SPAN[granularity] + 1)
        except _BadParameterError as exc:
            return error_response(400, "bad_request", str(exc))
        if start > end:
            return error_response(400, "bad_request", "'from' must not be after 'to'")
        grain: Granularity = "hour" if granularity == "hour" else "day"
        storage = limiter.storage
        # Beside requests, each other unit the caller's tier limits (tokens): its own series.
        tier = limiter.limit_set_for(caller.tier, caller.key).tier
        units = list(dict.fromkeys(hit.limit.unit for hit in tier.hits
                                   if hit.limit.unit != "requests"))
        try:
            buckets = await limiter.read(lambda: storage.usage(caller.key, grain, start, end))
            spent = [await limiter.read(partial(storage.usage, caller.key, grain, start, end,
                                                unit)) for unit in units]
        except (StorageError, TimeoutError) as exc:
            return _unavailable("The history", limiter, exc)
        rows: list[dict[str, Any]] = [{"start": iso_utc(epoch), "requests": count}
                                      for epoch, count in buckets]
        body: dict[str, Any] = {
            "plan": caller.tier.name,
            "granularity": granularity,
            "from": iso_utc(start),
            "to": iso_utc(end),
            "buckets": rows,
            "total": sum(count for _, count in buckets),
        }
        for unit, series in zip(units, spent, strict=True):
            for row, (_, count) in zip(rows, series, strict=False):
                row[unit] = count
            body[f"total_{unit}"] = sum(count for _, count in series)
        return JSONResponse(body, headers={"Cache-Control": "no-store"})


class _Report:
    """The tier's limits and what each counts now, gathered from a peek."""

    __slots__ = ("burst", "concurrency", "counted", "limits")

    def __init__(self) -> None:
        self.limits: dict[str, int] = {}
        self.burst: dict[str, int] = {}
        self.counted: dict[tuple[str, str], int] = {}  # (unit, period) -> used
        self.concurrency: dict[str, int] | None = None

    def add(self, decision: Decision) -> None:
        limit = decision.limit
        used = max(0, decision.quota - decision.remaining)
        if limit.is_concurrency:
            self.concurrency = {"limit": limit.capacity, "in_flight": used}
            return
        period = _unit(limit.period)
        name = f"{limit.unit}_per_{period}"
        if name not in self.limits or limit.amount < self.limits[name]:
            self.limits[name] = limit.amount
            self.counted[limit.unit, period] = used
            if limit.burst is not None:
                self.burst[name] = limit.burst


def quota_router(path: str = QUOTA_PATH, *, allow_anonymous: bool = False) -> Router:
    """A router with ``GET {path}`` and ``GET {path}/history``.

    FastAPI: ``app.include_router(quota_router())`` (it is then a FastAPI
    ``APIRouter``); Starlette: ``Starlette(routes=[*quota_router().routes])``. The
    routes are plain Starlette routes, so they serve in either app; FastAPI leaves them
    out of its OpenAPI document, and ``ratelimit_mw.openapi.document_limits`` adds them.
    """
    endpoints = _QuotaEndpoints(allow_anonymous=allow_anonymous)
    routes = [
        Route(path, endpoints.quota, methods=["GET"], name="account_quota"),
        Route(f"{path}/history", endpoints.history, methods=["GET"],
              name="account_quota_history"),
    ]
    try:
        from fastapi import APIRouter
    except ImportError:  # a Starlette app: FastAPI is an optional extra
        return Router(routes=routes)
    return APIRouter(routes=list(routes))

"""The two quota endpoints (``quota_router``) as the OpenAPI document describes them.

``quota_router`` makes plain Starlette routes, so that one router serves FastAPI and
Starlette apps alike; FastAPI leaves such routes out of its document. ``document_limits``
finds them among the app's routes and adds their operations from here: the bodies
``ratelimit_mw.quota`` answers with (the tests check real answers against them).
"""

from __future__ import annotations

import re
from typing import Any

from .. import quota
from .components import JSON, error_schema, ref

__all__ = ["quota_operation"]

_COUNT: JSON = {"type": "integer", "minimum": 0}
_MOMENT: JSON = {"type": "string", "format": "date-time"}

QUOTA_SCHEMA: JSON = {
    "type": "object",
    "description": "The caller's plan, its limits and what they count now.",
    "required": ["plan", "period", "limits", "usage", "resets_at"],
    "properties": {
        "plan": {"type": "string", "description": "The caller's tier."},
        "period": {"type": "string", "pattern": r"^[0-9]{4}-[0-9]{2}$",
                   "description": "The current UTC calendar month, e.g. `2024-01`."},
        "limits": {
            "type": "object",
            "description": "One `<unit>_per_<period>` entry per rate limit of the tier "
                           "(its sustained amount): `requests_per_minute`, and for a limit "
                           "of another unit, e.g. `tokens_per_minute`.",
            "propertyNames": {"pattern": "^[a-z0-9_-]+_per_"},
            "additionalProperties": _COUNT,
        },
        "usage": {
            "type": "object",
            "required": ["requests_today", "requests_this_minute"],
            "properties": {
                "requests_today": {"type": ["integer", "null"], "minimum": 0,
                                   "description": "Admitted requests (in units) this UTC "
                                                  "day; null when nothing counts them."},
                "requests_this_minute": {"type": ["integer", "null"], "minimum": 0,
                                         "description": "What the per-minute limit counts "
                                                        "now; null without one."},
                "requests_this_month": {**_COUNT, "description": "What the monthly limit "
                                        "counts (only with one)."},
            },
            "additionalProperties": {
                **_COUNT, "description": "`<unit>_this_<period>`: what a limit of another "
                "unit counts now, settled charges included (e.g. `tokens_this_minute`)."},
        },
        "resets_at": {**_MOMENT, "description": "The start of the next UTC month."},
        "burst": {"type": "object", "propertyNames": {"pattern": "^requests_per_"},
                  "additionalProperties": _COUNT,
                  "description": "The bursts of the tier's token buckets and GCRA limits."},
        "concurrency": {"type": "object", "required": ["limit", "in_flight"],
                        "properties": {"limit": _COUNT, "in_flight": _COUNT},
                        "description": "The tier's limit on requests in flight, and how "
                                       "many are (this one included)."},
    },
}

HISTORY_SCHEMA: JSON = {
    "type": "object",
    "description": "Admitted requests (in units) per UTC hour or day; where the tier "
                   "limits another unit, what was spent of it (`tokens` per bucket, "
                   "`total_tokens`), settled charges included.",
    "required": ["plan", "granularity", "from", "to", "buckets", "total"],
    "properties": {
        "plan": {"type": "string", "description": "The caller's tier."},
        "granularity": {"type": "string", "enum": ["hour", "day"]},
        "from": _MOMENT,
        "to": _MOMENT,
        "buckets": {"type": "array", "items": {
            "type": "object", "required": ["start", "requests"],
            "properties": {"start": _MOMENT, "requests": _COUNT},
            "additionalProperties": _COUNT}},
        "total": _COUNT,
    },
    "additionalProperties": _COUNT,
}

# A moment as the history endpoint reads it, written so that whatever matches is taken:
# epoch seconds, an ISO date, or an ISO date-time (years 1980 to 8999, days to the 28th).
_DAY = r"(19[89][0-9]|[2-8][0-9]{3})-(0[1-9]|1[0-2])-(0[1-9]|1[0-9]|2[0-8])"
_TIME = r"T([01][0-9]|2[0-3]):[0-5][0-9](:[0-5][0-9](\.[0-9]{1,6})?)?(Z|[+-]0[0-9]:[0-5][0-9])?"
MOMENT_PATTERN = rf"^([0-9]{{1,11}}(\.[0-9]{{1,6}})?|{_DAY}({_TIME})?)$"


def _moment(name: str, description: str) -> JSON:
    return {"name": name, "in": "query", "required": False, "description": description,
            "schema": {"type": "string", "pattern": MOMENT_PATTERN}}


_HISTORY_PARAMETERS: list[JSON] = [
    {"name": "granularity", "in": "query", "required": False,
     "schema": {"type": "string", "enum": ["hour", "day"], "default": "day"},
     "description": "Buckets of an hour or of a day."},
    _moment("from", "The start: an ISO date (`2024-01-31`), an ISO date-time "
            "(`2024-01-31T10:00:00Z`) or epoch seconds. Default: 24 hours (hour) or 30 "
            "days (day) before `to`."),
    _moment("to", "The end, in the same forms (a date means the end of that day); not "
            "before `from`. Default: now."),
]


def _error(description: str, code: str, headers: JSON | None = None) -> JSON:
    answer: JSON = {"description": description, "content": {"application/json": {
        "schema": error_schema([code], description)}}}
    if headers:
        answer["headers"] = headers
    return answer


_UNAUTHORIZED = _error("Who you are is not known: send your API key.", "unauthorized", {
    "WWW-Authenticate": {"description": "How to authenticate.", "schema": {"type": "string"}}})
_UNAVAILABLE = _error("The storage can't be read right now; retry after Retry-After "
                      "seconds.", "quota_unavailable",
                      {"Retry-After": ref("headers", "Retry-After")})


def _ok(description: str, schema: JSON) -> JSON:
    return {"description": description, "content": {"application/json": {"schema": schema}},
            "headers": {"Cache-Control": {"description": "`no-store`: the numbers are "
                                                         "the caller's, and change.",
                                          "schema": {"type": "string"}}}}


_OPERATIONS: dict[str, JSON] = {
    "account_quota": {
        "summary": "Your plan, limits and usage",
        "responses": {"200": _ok("The caller's plan, limits and usage.", QUOTA_SCHEMA),
                      "401": _UNAUTHORIZED, "503": _UNAVAILABLE},
    },
    "account_quota_history": {
        "summary": "Your usage per hour or day",
        "parameters": _HISTORY_PARAMETERS,
        "responses": {
            "200": _ok("The caller's usage per hour or day.", HISTORY_SCHEMA),
            "400": _error("A query parameter can't be understood.", "bad_request"),
            "401": _UNAUTHORIZED,
            "404": _error("Usage history is not recorded here.", "quota_history_disabled"),
            "503": _UNAVAILABLE,
        },
    },
}


def quota_operation(route: Any, path: str) -> JSON | None:
    """The GET operation of ``route`` (mounted at ``path``) when it is one of
    ``quota_router``'s, else None: a fresh copy, the document's to change."""
    name = getattr(route, "name", None)
    endpoint = getattr(route, "endpoint", None)
    if name not in _OPERATIONS or getattr(endpoint, "__module__", None) != quota.__name__:
        return None
    operation: JSON = _copy(_OPERATIONS[name])
    operation_id = re.sub(r"\W", "_", f"{name}{path}")
    return {"tags": ["quota"], **operation, "operationId": f"{operation_id}_get"}


def _copy(value: Any) -> Any:
    """A deep copy of JSON made of dicts and lists."""
    if isinstance(value, dict):
        return {key: _copy(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_copy(item) for item in value]
    return value

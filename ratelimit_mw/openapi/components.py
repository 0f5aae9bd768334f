"""What the OpenAPI document says of the library's answers: the JSON schemas of its
bodies and the response headers of each header style, in ``components``.

The bodies are those ``responses.error_body`` and ``denial_body`` make; the tests
check real answers against these schemas, so the two can't drift apart.
"""

from __future__ import annotations

import math
from typing import Any

from ..headers import HeaderStyle
from ..limits import Limit

__all__ = [
    "HEADERS",
    "SCHEMAS",
    "error_schema",
    "limit_info",
    "ref",
    "style_headers",
]

JSON = dict[str, Any]

_WAIT: JSON = {
    "type": ["integer", "null"], "minimum": 0,
    "description": "Whole seconds to wait before retrying (as Retry-After); null when the "
                   "request can never be admitted.",
}


def error_schema(codes: list[str], description: str, fields: JSON | None = None,
           required: tuple[str, ...] = ()) -> JSON:
    """An object of the library's one body shape: ``error``, ``message``, then its own
    ``fields``."""
    return {
        "type": "object",
        "description": description,
        "required": ["error", "message", *required],
        "properties": {
            "error": {"type": "string", "enum": codes,
                      "description": "A code a program can test."},
            "message": {"type": "string", "description": "What happened, for a person."},
            **(fields or {}),
        },
    }


_DENIAL_FIELDS: JSON = {
    "retry_after_seconds": _WAIT,
    "limit": {"type": "integer", "minimum": 0,
              "description": "The capacity of the limit that refused (a bucket's burst)."},
    "window": {"type": ["string", "null"], "pattern": r"^[0-9]+(\.[0-9]+)?s$",
               "description": "Its window, e.g. '60s'; null for a limit on requests in "
                              "flight."},
    "reset_at": {"type": ["string", "null"], "format": "date-time",
                 "description": "When the request would be admitted (UTC)."},
}

SCHEMAS: dict[str, JSON] = {
    "RateLimitExceeded": error_schema(
        ["rate_limit_exceeded"], "A request refused by a rate limit (429).", _DENIAL_FIELDS,
        tuple(_DENIAL_FIELDS)),
    "RateLimitProblem": {
        "type": "object",
        "description": "A request refused by a rate limit (429), as an RFC 9457 problem "
                       "(draft-ietf-httpapi-ratelimit-headers' quota-exceeded).",
        "required": ["type", "title", "status", "detail", "violated-policies",
                     *_DENIAL_FIELDS],
        "properties": {
            "type": {"type": "string", "format": "uri"},
            "title": {"type": "string"},
            "status": {"type": "integer", "const": 429},
            "detail": {"type": "string"},
            "violated-policies": {"type": "array", "items": {"type": "string"},
                                  "description": "The policies (as the headers name them) "
                                                 "that refused."},
            **_DENIAL_FIELDS,
        },
    },
    "ServiceUnavailable": error_schema(
        ["rate_limit_unavailable", "service_unavailable", "idempotency_unavailable"],
        "The request was not tried: a store or a dependency is down (503).", {
            "retry_after_seconds": {"type": "integer", "minimum": 0,
                                    "description": "Whole seconds to wait before retrying "
                                                   "(as Retry-After)."},
            "circuit": {"type": "string", "description": "The circuit breaker that refused."},
            "circuit_state": {"type": "string", "enum": ["open", "half_open"]},
        }, ("retry_after_seconds",)),
    "IdempotencyError": error_schema(
        ["idempotency_key_missing", "idempotency_key_invalid", "idempotency_key_in_use",
         "idempotency_key_reused", "request_too_large"],
        "A request the Idempotency-Key protocol refused; the handler did not run."),
}


def _header(description: str, schema: JSON, *, required: bool = False) -> JSON:
    header: JSON = {"description": description, "schema": schema}
    if required:
        header["required"] = True
    return header


_COUNT: JSON = {"type": "integer", "minimum": 0}
_TEXT: JSON = {"type": "string"}

HEADERS: dict[str, JSON] = {
    "Retry-After": _header("Whole seconds to wait before retrying.", _COUNT, required=True),
    "Idempotency-Key": _header("The request's Idempotency-Key, as it was sent.", _TEXT),
    "X-Idempotent-Replayed": _header(
        "`true`: this is the stored answer to an earlier request with this key.",
        {"type": "string", "enum": ["true"]}),
}
"""The headers every document that mentions them shares."""

_STYLE_HEADERS: dict[HeaderStyle, dict[str, JSON]] = {
    "legacy": {
        "X-RateLimit-Limit": _header(
            "Requests the limit closest to exhaustion admits (a bucket's burst).", _COUNT),
        "X-RateLimit-Remaining": _header("Requests that limit admits now.", _COUNT),
        "X-RateLimit-Reset": _header(
            "When that limit is whole again, in Unix epoch seconds.", _COUNT),
        "X-RateLimit-Policy": _header(
            'That limit as a policy, e.g. `100;w=60;comment="per minute"`.', _TEXT),
    },
    "draft-6": {
        "RateLimit-Limit": _header("The quota of the limit closest to exhaustion.", _COUNT),
        "RateLimit-Remaining": _header("What that limit admits now.", _COUNT),
        "RateLimit-Reset": _header("Seconds until that limit is whole again.", _COUNT),
        "RateLimit-Policy": _header("The policy of that limit, e.g. `100;w=60`.", _TEXT),
    },
    "draft-7": {
        "RateLimit": _header("The limit closest to exhaustion: "
                             "`limit=100, remaining=42, reset=30`.", _TEXT),
        "RateLimit-Policy": _header("The policy of that limit, e.g. `100;w=60`.", _TEXT),
    },
    "draft-11": {
        "RateLimit": _header('What each policy has left, e.g. `"burst";r=50;t=30`.', _TEXT),
        "RateLimit-Policy": _header(
            'The policies, e.g. `"burst";q=100;w=60,"daily";q=1000;w=86400`.', _TEXT),
    },
}


def ref(kind: str, name: str) -> JSON:
    """``{"$ref": "#/components/<kind>/<name>"}``."""
    return {"$ref": f"#/components/{kind}/{name}"}


def style_headers(styles: tuple[HeaderStyle, ...]) -> dict[str, JSON]:
    """The response headers the header ``styles`` send, by name."""
    return {name: header for style in styles for name, header in _STYLE_HEADERS[style].items()}


def limit_info(name: str, limit: Limit, *, shadow: bool = False) -> JSON:
    """A limit as the document describes it: the policy's name, quota and window, as
    the headers report them, and the rate it was written as."""
    if limit.is_concurrency:
        info: JSON = {"name": name, "quota": limit.capacity, "unit": "concurrent-requests"}
    else:
        info = {"name": name, "rate": str(limit.rate), "algorithm": limit.algorithm,
                "quota": limit.capacity, "window": max(1, math.ceil(limit.period))}
        if limit.burst is not None:
            info["burst"] = limit.burst
    if shadow:
        info["shadow"] = True
    return info

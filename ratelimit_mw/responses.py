"""The answers the library makes itself: the 429 of a denial (JSON, ``application/problem+json``
or your own), and one body shape for every other (a 503 while the storage is down, the
quota endpoints' and idempotency's errors, a breaker's refusal)."""

from __future__ import annotations

import json
import math
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Literal, get_args

from starlette.responses import JSONResponse, Response
from starlette.types import Scope, Send

from .asgi import Header
from .decision import Decision, Verdict
from .errors import ConfigError
from .headers import policy_label

__all__ = [
    "RESPONSE_FORMATS",
    "Denial",
    "DeniedHook",
    "ResponseFormat",
    "denial_body",
    "error_body",
    "error_response",
    "iso_utc",
    "json_body",
    "send_response",
    "unavailable_body",
]

ResponseFormat = Literal["json", "problem+json"]
RESPONSE_FORMATS: tuple[ResponseFormat, ...] = get_args(ResponseFormat)
PROBLEM_TYPE = "https://iana.org/assignments/http-problem-types#quota-exceeded"


@dataclass(frozen=True, slots=True)
class Denial:
    """A request refused by a rate limit: what a custom response hook is given."""

    key: str
    tier: str
    route: str
    verdict: Verdict
    decision: Decision
    now: float
    policies: tuple[str, ...]

    @property
    def retry_after(self) -> float:
        """Seconds until the request would be admitted (``math.inf``: never)."""
        return self.verdict.retry_after


DeniedHook = Callable[[Scope, Denial], "Response | Awaitable[Response]"]
"""``on_denied(scope, denial)`` returns the response to send instead of the default 429."""


def check_format(value: str) -> ResponseFormat:
    """``json`` or ``problem+json``, or a ConfigError."""
    text = str(value).strip().lower().removeprefix("application/")
    for known in RESPONSE_FORMATS:
        if text == known:
            return known
    msg = f"unknown response format {value!r}; expected one of {', '.join(RESPONSE_FORMATS)}"
    raise ConfigError(msg)


def _per(decision: Decision) -> str:
    """``100 requests per minute``; ``10 requests per minute (bursts of up to 20)`` for
    a bucket whose burst is not its rate (the body's ``limit`` is the burst)."""
    rate = decision.limit.rate
    noun = "request" if rate.amount == 1 else "requests"
    per = f"{rate.amount} {noun} per {str(rate).split('/', 1)[1]}"
    if decision.quota != rate.amount:
        per += f" (bursts of up to {decision.quota})"
    return per


def _window(period_us: int) -> str:
    """``60s``, ``2592000s``, ``0.5s``: a period in seconds, never in exponent notation."""
    seconds, micros = divmod(period_us, 1_000_000)
    return f"{seconds}s" if not micros else f"{seconds}.{micros:06d}".rstrip("0") + "s"


def iso_utc(epoch: float) -> str:
    """``2024-01-01T00:01:00Z``: epoch seconds as an ISO 8601 UTC time, to the second."""
    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def denial_body(denial: Denial, fmt: ResponseFormat = "json") -> tuple[bytes, bytes]:
    """The content type and body of the 429 for ``denial``."""
    decision = denial.decision
    wait = denial.retry_after
    retry = math.ceil(wait) if math.isfinite(wait) else None
    concurrent = decision.limit.is_concurrency
    if concurrent:
        message = (f"Too many requests in flight. You may have at most {decision.quota} "
                   f"concurrent requests.")
    elif retry is None:
        message = (f"This request can never be admitted: it costs more than the limit of "
                   f"{_per(decision)} allows.")
    else:
        message = f"Too many requests. You have exceeded {_per(decision)}."
    fields: dict[str, object] = {
        "retry_after_seconds": retry,
        "limit": decision.quota,
        "window": None if concurrent else _window(decision.limit.period_us),
        "reset_at": None if retry is None else iso_utc(math.ceil(denial.now + wait)),
    }
    if fmt == "problem+json":
        body = {
            "type": PROBLEM_TYPE,
            "title": "Request cannot be satisfied as assigned quota has been exceeded",
            "status": 429,
            "detail": message,
            "violated-policies": [policy_label(name) for name in denial.policies],
            **fields,
        }
        return b"application/problem+json", json_body(body)
    return b"application/json", json_body(error_body("rate_limit_exceeded", message, **fields))


def unavailable_body(retry_after: int) -> bytes:
    """The body of the 503 sent while the storage is down and the policy is ``closed``."""
    return json_body(error_body(
        "rate_limit_unavailable", "The rate limiter cannot decide right now; try again shortly.",
        retry_after_seconds=retry_after))


def error_body(error: str, message: str, **fields: object) -> dict[str, object]:
    """The JSON body of every answer the library makes: ``error`` (a code a program
    can test), ``message`` (for a person), then the answer's own fields (first
    ``retry_after_seconds`` when the client should wait)."""
    return {"error": error, "message": message, **fields}


def error_response(status: int, error: str, message: str, *,
                   headers: Mapping[str, str] | None = None, **fields: object) -> JSONResponse:
    """An answer of the library's own (never stored by caches): see ``error_body``."""
    return JSONResponse(error_body(error, message, **fields), status_code=status,
                        headers={"Cache-Control": "no-store", **(headers or {})})


def json_body(value: object) -> bytes:
    """``value`` as compact ASCII JSON, as every body the library makes is written."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=True).encode()




async def send_response(
    send: Send, status: int, content_type: bytes, body: bytes, headers: Iterable[Header],
) -> None:
    """Send a complete response straight to ASGI, with ``Cache-Control: no-store``."""
    await send({
        "type": "http.response.start",
        "status": status,
        "headers": [
            (b"content-type", content_type),
            (b"content-length", str(len(body)).encode()),
            (b"cache-control", b"no-store"),
            *headers,
        ],
    })
    await send({"type": "http.response.body", "body": body})

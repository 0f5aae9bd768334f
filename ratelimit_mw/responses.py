"""The answers the library makes itself: the 429 of a denial (JSON, ``application/problem+json``
or your own), and one body shape for every other (a 503 while the storage is down, the
quota endpoints' and idempotency's errors, a breaker's refusal). ``Refusals`` renders
every refusal the middleware sends."""

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
from .headers import policy_label, retry_after_value
from .limit_sets import LimitSet
from .outcome import Rendered

__all__ = [
    "RESPONSE_FORMATS",
    "Denial",
    "DeniedHook",
    "Refusals",
    "ResponseFormat",
    "denial_body",
    "denial_headers",
    "denial_of",
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


def denial_of(key: str, limit_set: LimitSet, verdict: Verdict, now: float) -> Denial:
    """The denial of ``verdict`` (a refused one) for the caller ``key`` on ``limit_set``."""
    binding = verdict.binding
    if binding is None:  # a storage that refused without saying which limit did
        msg = "a refused verdict names the decision that refused it"
        raise ValueError(msg)
    names = limit_set.names
    return Denial(key, limit_set.tier.name, limit_set.route.label, verdict, binding, now,
                  tuple(names.get((d.scope, d.limit), d.limit.name)
                        for d in verdict.decisions if not d.allowed))


def denial_headers(headers: list[Header], verdict: Verdict) -> list[Header]:
    """A denial's headers: the rate-limit headers, then ``Retry-After`` (none when no
    wait admits the request)."""
    retry_after = retry_after_value(verdict.retry_after)
    return headers if retry_after is None else [*headers, (b"retry-after", retry_after)]


class Refusals:
    """Renders every refusal the middleware sends: the 429 of a denial (in
    ``response_format``), the 429 of a caller an override blocks, and the 503 while the
    storage cannot decide and the policy is closed. With ``custom`` (an ``on_denied``
    hook), the app answers denials and blocks: none of them is rendered here."""

    __slots__ = ("custom", "format")

    def __init__(self, response_format: ResponseFormat = "json", *, custom: bool = False) -> None:
        self.format = check_format(response_format)
        self.custom = custom

    def denial(self, key: str, limit_set: LimitSet, verdict: Verdict, headers: list[Header],
               now: float) -> Rendered | None:
        """The 429 of ``verdict``, refused by its limits."""
        if self.custom:
            return None
        content_type, body = denial_body(denial_of(key, limit_set, verdict, now), self.format)
        return 429, content_type, body, denial_headers(headers, verdict)

    def block(self, headers: list[Header], wait: int, now: float) -> Rendered | None:
        """The 429 of a caller an override blocks for ``wait`` more seconds."""
        if self.custom:
            return None
        until = iso_utc(now + wait)
        body = json_body(error_body(
            "blocked", f"Requests from this caller are blocked until {until}.",
            retry_after_seconds=wait, limit=0, window=None, reset_at=until))
        return 429, b"application/json", body, [*headers, (b"retry-after", b"%d" % wait)]

    @staticmethod
    def held_too_many(headers: list[Header], wait: int) -> Rendered:
        """The 429 of a request whose turn is ``wait`` seconds ahead while its worker
        already holds its most (``max_held_requests``); rendered with an ``on_denied``
        hook too, which is given denials by limits only."""
        body = json_body(error_body(
            "rate_limited", f"Too many requests are waiting for their turn; retry after "
            f"{wait} seconds.", retry_after_seconds=wait))
        return 429, b"application/json", body, [*headers, (b"retry-after", b"%d" % wait)]

    @staticmethod
    def unavailable(retry_after: int) -> Rendered:
        """The 503 while the storage cannot decide (``retry_after``: whole seconds)."""
        return (503, b"application/json", unavailable_body(retry_after),
                [(b"retry-after", b"%d" % retry_after)])


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
    unit = decision.limit.unit
    noun = unit.removesuffix("s") if rate.amount == 1 else unit
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

"""What one operation of the document gets: the answers and headers of the rate
limiter, of ``IdempotencyMiddleware`` and of circuit breakers, merged into what the app
already declares."""

from __future__ import annotations

from typing import Any

from ..idempotency.header import MAX_KEY_LENGTH
from .components import JSON, ref

__all__ = ["add_header", "add_response", "idempotency_parameter", "unavailable"]

# A key as the middleware takes it: printable ASCII, 1 to 255 characters, plain or as a
# Structured Field string ("..." with \" and \\ escapes); spaces around are trimmed.
_PLAIN = rf"[!#-~](?:[ -~]{{0,{MAX_KEY_LENGTH - 2}}}[!-~])?"
_QUOTED = rf'"(?:[ !#-\[\]-~]|\\["\\]){{1,{MAX_KEY_LENGTH}}}"'
KEY_PATTERN = rf"^[ \t]*(?:{_PLAIN}|{_QUOTED})[ \t]*$"


def add_response(operation: JSON, status: str, description: str, *,
                 schema: JSON | None = None, media: str = "application/json",
                 headers: dict[str, JSON] | None = None) -> None:
    """Declare the ``status`` answer; one the app declares already gets ours beside its
    own (the descriptions joined, the two body schemas as ``anyOf``)."""
    responses: JSON = operation.setdefault("responses", {})
    response: JSON | None = responses.get(status)
    if response is None:
        response = responses[status] = {"description": description}
    elif description not in response.get("description", ""):
        response["description"] = f"{response.get('description', '')} Or: {description}".strip()
    for name, header in (headers or {}).items():
        add_header(response, name, header)
    if schema is None:
        return
    content: JSON = response.setdefault("content", {})
    theirs: JSON | None = content.get(media, {}).get("schema")
    if theirs is None or theirs == schema:
        content.setdefault(media, {})["schema"] = schema
    else:
        alternatives = theirs["anyOf"] if set(theirs) == {"anyOf"} else [theirs]
        if schema not in alternatives:
            content[media]["schema"] = {"anyOf": [*alternatives, schema]}


def add_header(response: JSON, name: str, header: JSON) -> None:
    """Declare a response header, unless the response declares one of that name."""
    headers: JSON = response.setdefault("headers", {})
    if not any(known.lower() == name.lower() for known in headers):
        headers[name] = header


def idempotency_parameter(required: bool) -> JSON:
    """The ``Idempotency-Key`` request header."""
    return {
        "name": "Idempotency-Key",
        "in": "header",
        "required": required,
        "description": (
            "Makes this request safe to retry: a request with a key runs once, and a "
            "retry with the same key and the same request gets its first answer again "
            "(`X-Idempotent-Replayed: true`). A UUID is a good key"
            + (". Required here." if required else ".")),
        "schema": {"type": "string", "pattern": KEY_PATTERN},
    }


def unavailable(operation: JSON, causes: list[str], *, echo_key: bool) -> None:
    """The 503 of whatever of ``causes`` can refuse the operation untried."""
    headers: dict[str, Any] = {"Retry-After": ref("headers", "Retry-After")}
    if echo_key:
        headers["Idempotency-Key"] = ref("headers", "Idempotency-Key")
    add_response(operation, "503", "Service unavailable, nothing was tried: "
                 + "; ".join(causes) + ". Retry after Retry-After seconds.",
                 schema=ref("schemas", "ServiceUnavailable"), headers=headers)


"""Limits counted apart per something the request says: ``Limit(..., per=json_field(
"username"))`` counts a login's failures per username, within its caller's counters.

The middleware reads the body of a request to such a route before deciding (up to
``MAX_BODY`` bytes; the app still receives all of it), asks each partition for its
value, and counts the limit under it. A request without the value counts under one
shared value, never under none.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Awaitable, Callable
from typing import Any

from starlette.types import Message, Receive, Scope

from .errors import ConfigError

__all__ = ["MAX_BODY", "Partition", "counted_under", "json_field", "read_body", "values_of"]

MAX_BODY = 65_536
"""The most of a body read to find a partition's value (a login's JSON fits)."""
_MAX_VALUE = 64
"""A longer value is counted under its digest (keys stay short, whatever is sent)."""

Partition = Callable[[Scope, bytes], "str | None"]
"""``partition(scope, body) -> value``: what the request is counted under (None: the
shared value)."""


def json_field(name: str) -> Partition:
    """The value of the field ``name`` of a JSON object body, as text."""
    if not isinstance(name, str) or not name:
        msg = f"json_field needs a field name, got {name!r}"
        raise ConfigError(msg)

    def field_of(scope: Scope, body: bytes) -> str | None:
        try:
            data = json.loads(body)
        except (ValueError, UnicodeDecodeError):
            return None
        value = data.get(name) if isinstance(data, dict) else None
        if isinstance(value, bool) or not isinstance(value, str | int):
            return None
        return str(value)

    field_of.__qualname__ = f"json_field({name!r})"
    return field_of


def counted_under(value: str | None) -> str:
    """A partition's value as its counter's scope takes it: printable and short."""
    if not value:
        return "-"
    if len(value) <= _MAX_VALUE and value.isprintable() and "|" not in value:
        return value
    return "#" + hashlib.blake2b(value.encode("utf-8", "surrogateescape"),
                                 digest_size=12).hexdigest()


async def read_body(receive: Receive) -> tuple[bytes, Receive]:
    """The start of the request's body (up to ``MAX_BODY`` bytes), and a ``receive``
    that gives the app every message again, then goes on."""
    read: list[Message] = []
    size = 0
    while size < MAX_BODY:
        message = await receive()
        read.append(message)
        if message["type"] != "http.request":
            break
        size += len(message.get("body", b""))
        if not message.get("more_body"):
            break
    body = b"".join(m.get("body", b"") for m in read if m["type"] == "http.request")

    def replaying() -> Awaitable[Message]:
        if read:
            return _ready(read.pop(0))
        return receive()

    return body[:MAX_BODY], replaying


async def _ready(message: Message) -> Message:
    return message


def values_of(partitions: tuple[Partition, ...], scope: Scope, body: bytes) -> tuple[str, ...]:
    """Each partition's value for the request, as counted."""
    out = []
    for partition in partitions:
        try:
            value: Any = partition(scope, body)
        except Exception:  # the app's function: its failure counts under the shared value
            value = None
        out.append(counted_under(value if isinstance(value, str) else None))
    return tuple(out)

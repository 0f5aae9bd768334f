"""``send`` wrappers that add the rate-limit headers to a response's start (``holds.py``
has the one that also closes what a request holds at its end).

Each wrapper is a plain callable returning ``send``'s own awaitable: a coroutine of
its own would add an object and a layer of awaiting to every message.
"""

from __future__ import annotations

from collections.abc import Awaitable
from typing import Final

from starlette.types import Message, Send

from .asgi import Header

__all__ = ["AddingHeaders", "CompletingDenial", "with_headers"]

_RESPONSE_STARTS: Final = frozenset(("http.response.start", "websocket.http.response.start",
                              "websocket.accept"))

_LIMITER_HEADERS: Final = frozenset((
    b"x-ratelimit-limit", b"x-ratelimit-remaining", b"x-ratelimit-reset", b"x-ratelimit-policy",
    b"ratelimit", b"ratelimit-policy", b"ratelimit-limit", b"ratelimit-remaining",
    b"ratelimit-reset", b"retry-after"))
"""Every header name the middleware may add to a response."""


def _limiters(name: bytes) -> bool:
    """Whether the lower-case ``name`` is one the middleware may add (a unit's own
    ``x-ratelimit-remaining-tokens`` included)."""
    return name in _LIMITER_HEADERS or name.startswith((b"x-ratelimit-", b"ratelimit-"))


def with_headers(message: Message, headers: list[Header]) -> Message:
    """A copy of the response start ``message`` with ``headers`` added, but for those
    the app set itself (its own win: never two of one name, which clients can't read).
    A copy: whoever sent the message may keep it (as a record of the response)."""
    own = message.get("headers", ())
    for header in own:
        name: bytes = header[0]
        # The first letter first, either case ("x" or "r" with bit 5 set): most names go
        # by without a lower-cased copy or a hash.
        if name and (name[0] | 0x20) in (0x72, 0x78) and _limiters(name.lower()):
            names = {name.lower() for name, _ in own}
            headers = [header for header in headers if header[0] not in names]
            break
    copy = dict(message)
    copy["headers"] = own + headers if type(own) is list else [*own, *headers]
    return copy


class AddingHeaders:
    """``send`` that adds ``headers`` to the response start (bodies stream untouched)."""

    __slots__ = ("headers", "send")

    def __init__(self, send: Send, headers: list[Header]) -> None:
        self.send = send
        self.headers = headers

    def __call__(self, message: Message) -> Awaitable[None]:
        kind = message["type"]
        # Most messages are an HTTP response's start or body: a string compared first.
        if kind == "http.response.start" or (
                kind != "http.response.body" and kind in _RESPONSE_STARTS):
            message = with_headers(message, self.headers)
        return self.send(message)


class CompletingDenial(AddingHeaders):
    """``send`` for a custom denial response (``on_denied``): adds the rate-limit headers
    and ``Retry-After`` that the response does not set itself (its own win, so never two
    of one), and ``Cache-Control: no-store`` to a 429 that says nothing about caching."""

    __slots__ = ()

    def __call__(self, message: Message) -> Awaitable[None]:
        if message["type"] in _RESPONSE_STARTS:
            added = self.headers
            if message.get("status") == 429 and all(
                    name.lower() != b"cache-control" for name, _ in message.get("headers", ())):
                added = [*added, (b"cache-control", b"no-store")]
            message = with_headers(message, added)
        return self.send(message)

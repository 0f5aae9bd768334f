"""``send`` wrappers: the rate-limit headers on a response's start, and slots given back at
its end.

Each wrapper is a plain callable returning ``send``'s own awaitable: a coroutine of
its own would add an object and a layer of awaiting to every message.
"""

from __future__ import annotations

from collections.abc import Awaitable
from typing import TYPE_CHECKING

from starlette.types import Message, Send

from .asgi import Header
from .decision import Lease
from .events import Source

if TYPE_CHECKING:
    from .slots import Slots

__all__ = ["AddingHeaders", "CompletingDenial", "ReleasingSlots", "with_headers"]

_RESPONSE_STARTS = frozenset(("http.response.start", "websocket.http.response.start",
                              "websocket.accept"))

_LIMITER_HEADERS = frozenset((
    b"x-ratelimit-limit", b"x-ratelimit-remaining", b"x-ratelimit-reset", b"x-ratelimit-policy",
    b"ratelimit", b"ratelimit-policy", b"ratelimit-limit", b"ratelimit-remaining",
    b"ratelimit-reset", b"retry-after"))
"""Every header name the middleware may add to a response."""
_LIMITER_INITIALS = frozenset(b"xXrR")
"""Their first letters, either case, as the ints a name's first byte reads as."""


def with_headers(message: Message, headers: list[Header]) -> Message:
    """A copy of the response start ``message`` with ``headers`` added, but for those
    the app set itself (its own win: never two of one name, which clients can't read).
    A copy: whoever sent the message may keep it (as a record of the response)."""
    own = message.get("headers", ())
    for name, _ in own:
        # The first letter first: most names go by without a lower-cased copy or a hash.
        if name and name[0] in _LIMITER_INITIALS and name.lower() in _LIMITER_HEADERS:
            names = {name.lower() for name, _ in own}
            headers = [header for header in headers if header[0] not in names]
            break
    return {**message, "headers": [*own, *headers]}


class AddingHeaders:
    """``send`` that adds ``headers`` to the response start (bodies stream untouched)."""

    __slots__ = ("headers", "send")

    def __init__(self, send: Send, headers: list[Header]) -> None:
        self.send = send
        self.headers = headers

    def __call__(self, message: Message) -> Awaitable[None]:
        if message["type"] in _RESPONSE_STARTS:
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


class ReleasingSlots:
    """``send`` for a request holding concurrency slots: adds ``headers`` to the response
    start, and gives the slots back just before the last body chunk (a HEAD response's
    start, whose body is never sent), so that a client that has seen the end of its
    response never finds its slot still taken, and a background task running after
    the response does not hold it.

    Where the storage gives slots back without awaiting (memory, pipelined Redis) the
    message goes out at once; else after the storage has answered. ``release`` and
    ``release_soon`` give them back when the request ends otherwise (the app raised,
    the client left); each of the three gives them back once at most.
    """

    __slots__ = ("head", "headers", "held", "leases", "send", "slots", "source")

    def __init__(self, send: Send, headers: list[Header], slots: Slots,
                 leases: tuple[Lease, ...], source: Source, head: bool) -> None:
        self.send = send
        self.headers = headers
        self.slots = slots
        self.leases = leases
        self.source = source
        self.head = head
        self.held = True

    def __call__(self, message: Message) -> Awaitable[None]:
        kind = message["type"]
        if kind == "http.response.start":
            if self.headers:
                message = with_headers(message, self.headers)
            if self.head and self.held:
                return self._released_then_sent(message)
        elif self.held and kind == "http.response.body" and not message.get("more_body"):
            return self._released_then_sent(message)
        return self.send(message)

    def _released_then_sent(self, message: Message) -> Awaitable[None]:
        self.held = False
        if self.slots.release_now(self.leases, self.source):
            return self.send(message)
        return self._release_and_send(message)

    async def _release_and_send(self, message: Message) -> None:
        await self.slots.release(self.leases, self.source)
        await self.send(message)

    async def release(self) -> None:
        """Give the slots back if the response did not (never raises)."""
        if self.held:
            self.held = False
            await self.slots.release(self.leases, self.source)

    def release_soon(self) -> None:
        """The client left: give the slots back now, or in a task of their own."""
        if self.held:
            self.held = False
            self.slots.release_soon(self.leases, self.source)

"""The ASGI messages of an idempotent request: its buffered body, handed to the app
again, and a stored response sent again, marked as replayed."""

from __future__ import annotations

from typing import Any

from starlette.types import Message, Receive, Scope, Send

from .store import StoredResponse

__all__ = ["BodyTooLargeError", "adding_header", "read_body", "replay", "replaying"]

_REPLAYED = (b"x-idempotent-replayed", b"true")


class BodyTooLargeError(Exception):
    """The request body is over ``max_request_size``."""


async def read_body(scope: Scope, receive: Receive, limit: int) -> bytes | None:
    """The whole request body; None if the client disconnected first; BodyTooLargeError
    past ``limit`` bytes."""
    for name, value in scope["headers"]:
        if name == b"content-length" and value.strip().isdigit() and int(value) > limit:
            raise BodyTooLargeError
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise BodyTooLargeError
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


def adding_header(send: Send, header: tuple[bytes, bytes]) -> Send:
    """A send that adds ``header`` to the response (the stored one stays without it)."""
    async def adding(message: Message) -> None:
        if message["type"] == "http.response.start":
            message = {**message, "headers": [*message.get("headers", ()), header]}
        await send(message)

    return adding


def replaying(body: bytes, receive: Receive) -> Receive:
    """A receive that hands the buffered body to the app, then defers to the server."""
    pending = True

    async def replay() -> Message:
        nonlocal pending
        if pending:
            pending = False
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay


async def replay(response: StoredResponse, send: Send) -> None:
    """Send a stored response again, marked as replayed."""
    headers: list[Any] = [*response.headers, _REPLAYED]
    await send({"type": "http.response.start", "status": response.status, "headers": headers})
    await send({"type": "http.response.body", "body": response.body, "more_body": False})

"""What this package reads of an ASGI request: its raw headers."""

from __future__ import annotations

from starlette.types import Scope

__all__ = ["Header", "first_header_value", "header_value", "header_values"]

Header = tuple[bytes, bytes]
"""One raw header of an ASGI message: lower-case name and value, both bytes."""


def header_values(scope: Scope, name: bytes) -> list[bytes]:
    """Every value of header ``name`` (lower-case bytes), in the order sent."""
    return [value for key, value in scope["headers"] if key == name]


def header_value(scope: Scope, name: bytes) -> str | None:
    """Every value of header ``name`` (lower-case bytes) joined by ``,``; None when absent.

    Header bytes are decoded as latin-1, which never fails, so hostile bytes can't raise.
    """
    values = header_values(scope, name)
    if not values:
        return None
    return b",".join(values).decode("latin-1")


def first_header_value(scope: Scope, name: bytes) -> str | None:
    """The first value of header ``name`` (lower-case bytes); None when absent.

    What Starlette's ``request.headers[name]`` and FastAPI's ``Header()`` read: a key or
    a tier comes from the value the app authenticates, so a valid key sent again beside
    a made-up one can't get a counter of its own.
    """
    value: bytes
    for key, value in scope["headers"]:
        if key == name:
            return value.decode("latin-1")
    return None

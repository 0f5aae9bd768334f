"""Exceptions raised by ratelimit_mw."""

from __future__ import annotations


class RateLimitError(Exception):
    """Base class of every error this library raises on purpose."""


class ConfigError(RateLimitError, ValueError):
    """A rate, limit or setting is invalid; raised when it is built, never per request."""


class StorageError(RateLimitError):
    """The storage backend could not answer (connection lost, timeout, script error)."""


def describe_error(exc: BaseException) -> str:
    """``Type: message`` of ``exc`` for a log line, at most 300 characters."""
    text = str(exc) or type(exc).__name__
    return f"{type(exc).__name__}: {text}"[:300]


OUT_OF_MEMORY = "command not allowed when used memory > 'maxmemory'"
"""Redis's error reply to a write while it is full (``noeviction``), after ``OOM``, which
redis-py's ``OutOfMemoryError`` leaves out."""


def out_of_memory(exc: BaseException) -> bool:
    """True when ``exc``, or an exception it was raised from, is Redis's ``OOM`` reply."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if OUT_OF_MEMORY in str(current):
            return True
        current = current.__cause__ or current.__context__
    return False

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

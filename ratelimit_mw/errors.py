"""Exceptions raised by ratelimit_mw."""

from __future__ import annotations


class RateLimitError(Exception):
    """Base class of every error this library raises on purpose."""


class ConfigError(RateLimitError, ValueError):
    """A rate, limit or setting is invalid; raised when it is built, never per request."""


class StorageError(RateLimitError):
    """The storage backend could not answer (connection lost, timeout, script error)."""

"""Checks of configuration values, each failing with a ConfigError that names the value.

The constructors of the compiled classes (see ``pyproject.toml``) take the arguments
they check typed ``object`` and check them themselves: compiled with mypyc, a typed
parameter would refuse a bad value before any check, with a TypeError that names
neither the argument nor the value, and an ``int`` one would take ``True`` for 1.
"""

from __future__ import annotations

import math

from .errors import ConfigError

__all__ = ["header_name", "is_token", "positive_seconds"]

_TCHARS = frozenset("!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyz"
                    "ABCDEFGHIJKLMNOPQRSTUVWXYZ")


def is_token(text: str) -> bool:
    """True for an RFC 9110 token: what a header name or a method is made of."""
    return bool(text) and set(text) <= _TCHARS


def header_name(value: object, what: str) -> str:
    """``value`` as a lower-case HTTP header name (an RFC 9110 token), or a ConfigError
    naming ``what`` and the value (a name no request can carry would never match)."""
    name = value.strip().lower() if isinstance(value, str) else ""
    if not is_token(name):
        msg = (f"{what} must be an HTTP header name (letters, digits and !#$%&'*+-.^_`|~), "
               f"got {value!r}")
        raise ConfigError(msg)
    return name


def positive_seconds(name: str, value: object) -> float:
    """``value`` as a positive, finite number of seconds, or a ConfigError naming it."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not (
            0 < value < math.inf):
        msg = f"{name} must be a positive number of seconds, got {value!r}"
        raise ConfigError(msg)
    return float(value)

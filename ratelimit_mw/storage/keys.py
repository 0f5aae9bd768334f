"""Redis key names: client-supplied parts are escaped or hashed, so they cannot collide."""

from __future__ import annotations

from functools import lru_cache
from hashlib import blake2b
from urllib.parse import quote_from_bytes

from ..errors import ConfigError

__all__ = ["check_prefix", "counter_suffix", "encode_part", "glob_escape", "identity_tag",
           "redis_key"]

_MAX_PLAIN = 128


def encode_part(part: str) -> str:
    """An injective, brace-free, colon-free form of ``part``.

    Short parts are percent-encoded (readable for IPs and ids); long ones become
    ``%~`` and a 128-bit hash, a form that percent-encoding never produces.
    The empty string becomes ``%``, also never produced otherwise, so that a hash
    tag is never empty (Redis Cluster would then hash the whole key).
    """
    raw = part.encode("utf-8", "surrogatepass")
    if not raw:
        return "%"
    if len(raw) > _MAX_PLAIN:
        return "%~" + blake2b(raw, digest_size=16).hexdigest()
    return quote_from_bytes(raw, safe="")


@lru_cache(maxsize=4096)
def identity_tag(prefix: str, identity: str) -> str:
    """``prefix{identity}:``, the start of every key of one identity; the hash tag keeps
    them all in one Cluster slot. Cached: an identity decides, gives its slot back, and
    comes again."""
    return f"{prefix}{{{encode_part(identity)}}}:"


def redis_key(prefix: str, identity: str, scope: str, uid: str) -> str:
    """``prefix{identity}:scope:uid``, the counter of one limit in one scope."""
    return identity_tag(prefix, identity) + counter_suffix(scope, uid)


@lru_cache(maxsize=4096)
def counter_suffix(scope: str, uid: str) -> str:
    """``scope:uid``, what follows the identity's tag in a counter's key (scopes and
    limits come from configuration, so their encodings are worth caching)."""
    return f"{encode_part(scope)}:{uid}"


def check_prefix(prefix: str) -> str:
    """A key prefix must not hold braces: they would change the Cluster hash tag."""
    if not isinstance(prefix, str) or "{" in prefix or "}" in prefix:
        msg = f"key prefix {prefix!r} must be a string without '{{' or '}}'"
        raise ConfigError(msg)
    return prefix

def glob_escape(text: str) -> str:
    """Escape the characters that SCAN MATCH treats as a pattern."""
    return "".join(f"\\{c}" if c in "*?[]\\" else c for c in text)

"""Fingerprints of requests and record keys of callers: length-framed SHA-256, collision-free."""

from __future__ import annotations

import hashlib

__all__ = ["fingerprint", "record_key"]


def _framed(*parts: bytes) -> str:
    """SHA-256 of the parts, each preceded by its length, so no two tuples share a digest."""
    digest = hashlib.sha256()
    for part in parts:
        digest.update(len(part).to_bytes(8, "big"))
        digest.update(part)
    return digest.hexdigest()


def fingerprint(method: str, path: str, query: bytes, body: bytes) -> str:
    """What makes two requests "the same": method, path, raw query string and body.

    >>> fingerprint("POST", "/a", b"", b"x") == fingerprint("POST", "/a", b"", b"x")
    True
    >>> fingerprint("POST", "/a", b"", b"x") == fingerprint("POST", "/a", b"x", b"")
    False
    """
    return _framed(method.encode("ascii", "replace"), _utf8(path), query, body)


def record_key(identity: str, key: str) -> str:
    """Where one caller's Idempotency-Key is kept: a hash, so ``:``, braces or 10 kB are fine.

    >>> record_key("user:1", "k") != record_key("user:1k", "")
    True
    """
    return _framed(_utf8(identity), _utf8(key))


def _utf8(text: str) -> bytes:
    """UTF-8 that never fails: lone surrogates (from odd path bytes) are kept as they are."""
    return text.encode("utf-8", "surrogatepass")

"""The Idempotency-Key header: a Structured Field string (``"..."``) or a plain token."""

from __future__ import annotations

__all__ = ["MAX_KEY_LENGTH", "InvalidKeyError", "parse_idempotency_key"]

MAX_KEY_LENGTH = 255


class InvalidKeyError(ValueError):
    """The Idempotency-Key header is unusable; the message says why, for the 400 body."""


def _printable(text: str) -> bool:
    return all(" " <= char <= "~" for char in text)


def parse_idempotency_key(values: list[str]) -> str:
    """The key carried by the header ``values`` (one per header line, read as latin-1).

    A quoted value is parsed as an RFC 8941 sf-string (``\\"`` and ``\\\\`` escapes);
    anything else is taken as it is, after trimming spaces. The key must be 1 to
    255 printable ASCII characters, and the header must appear once.

    >>> parse_idempotency_key(['"8e03978e-40d5"']), parse_idempotency_key([" abc "])
    ('8e03978e-40d5', 'abc')
    """
    if len(values) != 1:
        msg = f"send one Idempotency-Key header, not {len(values)}"
        raise InvalidKeyError(msg)
    value = values[0].strip(" \t")
    key = _sf_string(value) if value.startswith('"') else value
    if not key:
        msg = "the Idempotency-Key is empty; send 1 to 255 printable ASCII characters"
        raise InvalidKeyError(msg)
    if len(key) > MAX_KEY_LENGTH:
        msg = f"the Idempotency-Key has {len(key)} characters; at most {MAX_KEY_LENGTH} are allowed"
        raise InvalidKeyError(msg)
    if not _printable(key):
        msg = "the Idempotency-Key must be printable ASCII (a UUID is a good choice)"
        raise InvalidKeyError(msg)
    return key


def _sf_string(value: str) -> str:
    """The content of an sf-string that is the whole of ``value``."""
    chars: list[str] = []
    escaped = False
    for index, char in enumerate(value[1:], start=1):
        if escaped:
            if char not in '"\\':
                msg = f"the quoted Idempotency-Key has a bad escape '\\{char}'"
                raise InvalidKeyError(msg)
            chars.append(char)
            escaped = False
        elif char == "\\":
            escaped = True
        elif char == '"':
            if index != len(value) - 1:
                msg = "the quoted Idempotency-Key has text after its closing quote"
                raise InvalidKeyError(msg)
            return "".join(chars)
        else:
            chars.append(char)
    msg = "the quoted Idempotency-Key has no closing quote"
    raise InvalidKeyError(msg)

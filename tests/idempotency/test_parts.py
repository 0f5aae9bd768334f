"""The small parts: header parsing, fingerprints, identity, configuration, public names."""

from __future__ import annotations

import doctest
import importlib
import inspect
import pkgutil
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from starlette.types import Scope

import ratelimit_mw.idempotency as idempotency
from ratelimit_mw.errors import ConfigError
from ratelimit_mw.idempotency import (
    MAX_KEY_LENGTH,
    IdempotencyMiddleware,
    InvalidKeyError,
    fingerprint,
    parse_idempotency_key,
    record_key,
)
from ratelimit_mw.identity import credentials

MODULES = sorted(
    f"ratelimit_mw.idempotency.{info.name}" for info in pkgutil.iter_modules(idempotency.__path__)
)


@pytest.mark.parametrize(
    ("value", "key"),
    [
        ("abc", "abc"),
        ("  abc\t", "abc"),
        ('"abc"', "abc"),
        ('"8e03978e-40d5-43e8-bc93-6894a57f9324"', "8e03978e-40d5-43e8-bc93-6894a57f9324"),
        ('"a\\"b\\\\c"', 'a"b\\c'),
        ('"with space"', "with space"),
        ("{user}:1", "{user}:1"),
        ("k" * MAX_KEY_LENGTH, "k" * MAX_KEY_LENGTH),
    ],
)
def test_keys_that_parse(value: str, key: str) -> None:
    """Plain tokens and sf-strings give the key they carry."""
    assert parse_idempotency_key([value]) == key


@pytest.mark.parametrize(
    ("values", "reason"),
    [
        ([""], "empty"),
        (['""'], "empty"),
        (["k" * (MAX_KEY_LENGTH + 1)], "256 characters"),
        (["a", "b"], "one Idempotency-Key"),
        (['"abc'], "no closing quote"),
        (['"abc"def'], "after its closing quote"),
        (['"abc";p=1'], "after its closing quote"),
        (['"a\\nb"'], "bad escape"),
        (["caf\xe9"], "printable ASCII"),
        (['"caf\xe9"'], "printable ASCII"),
        (["a\x00b"], "printable ASCII"),
        (["tab\there"], "printable ASCII"),
    ],
)
def test_keys_that_do_not_parse(values: list[str], reason: str) -> None:
    """Unusable keys raise InvalidKeyError with a message fit for the 400 body."""
    with pytest.raises(InvalidKeyError, match=reason):
        parse_idempotency_key(values)


@given(st.text(max_size=300))
def test_parsing_never_raises_anything_else(value: str) -> None:
    """Any header text gives a key or InvalidKeyError, nothing else."""
    try:
        key = parse_idempotency_key([value])
    except InvalidKeyError:
        return
    assert 1 <= len(key) <= MAX_KEY_LENGTH


def test_fingerprint_covers_method_path_query_and_body() -> None:
    """Changing any of the four parts changes the fingerprint."""
    base = ("POST", "/orders", b"a=1", b"{}")
    variants = [
        ("PATCH", "/orders", b"a=1", b"{}"),
        ("POST", "/orders/", b"a=1", b"{}"),
        ("POST", "/orders", b"a=2", b"{}"),
        ("POST", "/orders", b"a=1", b"{ }"),
        ("POST", "/ordersa=1", b"", b"{}"),
    ]
    assert len({fingerprint(*parts) for parts in [base, *variants]}) == 6
    assert fingerprint(*base) == fingerprint(*base)
    assert len(fingerprint(*base)) == 64


def test_record_keys_do_not_collide_on_separators() -> None:
    """Identity and key are framed, so moving characters between them changes the record."""
    pairs = [("a:b", "c"), ("a", "b:c"), ("a:b:c", ""), ("{a}", "b"), ("a", "}b")]
    assert len({record_key(*pair) for pair in pairs}) == len(pairs)
    assert record_key("\ud800", "x")  # a lone surrogate from odd path bytes does not raise


def scope_with(headers: list[tuple[bytes, bytes]], client: Any = ("203.0.113.7", 1)) -> Scope:
    return {"type": "http", "headers": headers, "client": client}


def test_credentials_tell_apart_whatever_differs() -> None:
    """Every value of Authorization and the API-key header counts, in order; the Cookie
    header only without either; no credential at all is None."""
    sent = [
        [(b"authorization", b"Bearer alice")],
        [(b"authorization", b"Bearer bob")],
        [(b"authorization", b"Basic YWxpY2U6cHc=")],
        [(b"x-api-key", b"k1")],
        [(b"x-api-key", b"k2")],
        [(b"x-api-key", b"k1"), (b"authorization", b"Bearer alice")],
        [(b"authorization", b"Bearer alice"), (b"x-api-key", b"k1")],
        [(b"x-api-key", b"k1"), (b"x-api-key", b"k2")],
        [(b"cookie", b"session=a")],
        [(b"cookie", b"session=b")],
    ]
    digests = [credentials(scope_with(headers), b"x-api-key") for headers in sent]
    assert None not in digests
    assert len(set(digests)) == len(sent)
    assert not any("alice" in str(digest) or "k1" in str(digest) for digest in digests)
    assert credentials(scope_with(sent[0]), b"x-api-key") == digests[0]  # stable
    with_cookie = [(b"cookie", b"session=a"), (b"authorization", b"Bearer alice")]
    assert credentials(scope_with(with_cookie), b"x-api-key") == digests[0]
    assert credentials(scope_with([(b"x-token", b"k1")]), b"x-token") is not None
    assert credentials(scope_with([(b"x-token", b"k1")]), b"x-api-key") is None
    assert credentials(scope_with([(b"accept", b"*/*")]), b"x-api-key") is None


async def app(scope: Scope, receive: Any, send: Any) -> None:
    """An ASGI app that does nothing."""


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"ttl": 0}, "ttl"),
        ({"ttl": float("inf")}, "ttl"),
        ({"lock_ttl": -1}, "lock_ttl"),
        ({"lock_ttl": True}, "lock_ttl"),
        ({"max_request_size": -1}, "max_request_size"),
        ({"max_response_size": 1.5}, "max_response_size"),
        ({"methods": ["GET", "POST"]}, "GET and HEAD"),
        ({"methods": []}, "methods"),
        ({"methods": ["PO ST"]}, "methods"),
        ({"required": ["payments"]}, "path pattern"),
        ({"required": ["PUT /payments"]}, "not in methods"),
        ({"store": object()}, "IdempotencyStore"),
        ({"identity": "x-api-key"}, "identity"),
    ],
)
def test_bad_configuration_is_refused(options: dict[str, Any], match: str) -> None:
    """Settings are checked when the middleware is built, with a message that says why."""
    with pytest.raises(ConfigError, match=match):
        IdempotencyMiddleware(app, **options)


def test_required_rules() -> None:
    """Rules are fnmatch path patterns, optionally limited to one method."""
    middleware = IdempotencyMiddleware(
        app, methods="post, patch", required=["/payments", "PATCH /orders/*"]
    )
    assert middleware.methods == {"POST", "PATCH"}
    assert middleware.requires_key("POST", "/payments")
    assert middleware.requires_key("PATCH", "/payments")
    assert not middleware.requires_key("POST", "/payments/1")
    assert middleware.requires_key("PATCH", "/orders/7")
    assert not middleware.requires_key("POST", "/orders/7")


def test_all_is_sorted_and_complete() -> None:
    """__all__ is sorted and lists exactly the public names of the package."""
    public = {
        name
        for name, value in vars(idempotency).items()
        if not name.startswith("_") and not inspect.ismodule(value) and name != "annotations"
    }
    order = sorted(public, key=lambda n: (0 if n.isupper() else 1 if n[0].isupper() else 2, n))
    assert idempotency.__all__ == order


@pytest.mark.parametrize(
    "module", ["ratelimit_mw.idempotency", "ratelimit_mw.breaker.guard", *MODULES])
def test_docstring_examples_run(module: str) -> None:
    """The examples in the docstrings are correct."""
    result = doctest.testmod(importlib.import_module(module), optionflags=doctest.ELLIPSIS)
    assert result.failed == 0

"""Hostile requests never cause a 500: huge keys, raw latin-1 bytes, broken Forwarded."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ratelimit_mw import MemoryStorage
from ratelimit_mw.routes import RouteRule
from ratelimit_mw.tiers import Tier

from .conftest import make_app

HEADER_NAMES = [b"x-forwarded-for", b"forwarded", b"x-api-key", b"x-plan", b"x-user"]
header_values = st.one_of(
    st.binary(max_size=300).map(lambda b: b.replace(b"\r", b"").replace(b"\n", b"")),
    st.text(alphabet=st.characters(min_codepoint=0x20, max_codepoint=0xFF), max_size=200)
    .map(lambda t: t.encode("latin-1")),
    st.sampled_from([
        b"x" * 10_000, b"for=", b"for=\"[", b'for="[::1', b"for=;;;,,,", b"\xff\xfe\x00",
        b"1.2.3.4, , ,", b"[2001:db8::1]:80", b"for=unknown", b"for=_hidden, for=\"\"",
        ("9" * 5000).encode(), b",".join([b"10.0.0.1"] * 500),
    ]),
)
paths = st.one_of(st.sampled_from(["/", "/stream", "/nope", "/items/%ff", "//", "/a/../b"]),
                  st.text(alphabet="abc/%{}*.", max_size=30).map(lambda p: "/" + p))


def _app(**options: Any) -> Any:
    return make_app(tiers=[Tier("free", "1000/minute"), Tier("pro", "5000/minute")],
                    storage=MemoryStorage(), trusted_proxies=["10.0.0.0/8", "127.0.0.1"],
                    rules=[RouteRule("/items/{id}", limits="100/minute")], **options)


APPS = [_app(key="ip"), _app(key="api_key", tier_header="x-plan"), _app(key="user",
        header_style="legacy+draft-11", response_format="problem+json")]


async def _call(app: Any, path: str, headers: list[tuple[bytes, bytes]], peer: str) -> int:
    sent: list[Any] = []
    requests = [{"type": "http.request", "body": b"", "more_body": False}]

    async def receive() -> Any:
        if requests:
            return requests.pop()
        await asyncio.Event().wait()  # connected until the response ends
        return {"type": "http.disconnect"}

    async def send(message: Any) -> None:
        sent.append(message)

    scope = {"type": "http", "method": "GET", "path": path, "raw_path": path.encode(),
             "root_path": "", "scheme": "http", "query_string": b"", "headers": headers,
             "client": (peer, 1), "server": ("test", 80), "http_version": "1.1",
             "asgi": {"version": "3.0"}}
    await app(scope, receive, send)
    return int(sent[0]["status"])


@pytest.mark.slow
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    app_index=st.integers(0, len(APPS) - 1),
    path=paths,
    headers=st.lists(st.tuples(st.sampled_from(HEADER_NAMES), header_values), max_size=4),
    peer=st.sampled_from(["10.0.0.1", "127.0.0.1", "203.0.113.7", "::1", "not-an-ip", ""]),
)
async def test_hostile_headers_never_500(
    app_index: int, path: str, headers: list[tuple[bytes, bytes]], peer: str,
) -> None:
    """Whatever the headers, paths and peers, the answer is never a 500."""
    status = await _call(APPS[app_index], path, headers, peer)
    assert status in (200, 404, 429)

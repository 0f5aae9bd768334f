"""Hostile input through the middleware: random forwarding headers, API keys and paths
never make a 500 or an uncaught exception; bad configurations are refused at start-up
with an error that names the bad value."""

from __future__ import annotations

import asyncio
import contextlib
import math
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Message

from ratelimit_mw import ConfigError, MemoryStorage
from ratelimit_mw.middleware import RateLimitMiddleware
from ratelimit_mw.routes import limit
from ratelimit_mw.settings import RateLimitSettings
from ratelimit_mw.tiers import Tier

pytestmark = pytest.mark.reliability


async def ok(request: Request) -> Response:
    return PlainTextResponse("ok")


@limit("3/minute", "gcra", burst=3)
async def item(request: Request) -> Response:
    return PlainTextResponse(request.path_params["id"])


def _app(key: str) -> ASGIApp:
    inner = Starlette(routes=[Route("/", ok), Route("/items/{id}", item)])
    return RateLimitMiddleware(
        inner,
        storage=MemoryStorage(max_keys=1000),
        key=key,
        tiers=[Tier("free", "5/minute"), Tier("pro", "50/minute; 1000/day")],
        settings=RateLimitSettings(
            tier_header="x-tier",
            header_style="legacy+draft-11",
            trusted_proxies=["127.0.0.1", "10.0.0.0/8", "2001:db8::/32"],
        ),
    )


APPS = {key: _app(key) for key in ("ip", "api_key")}

ip_like = st.one_of(
    st.ip_addresses().map(str),
    st.ip_addresses(v=6).map(lambda a: f"[{a}]:{443}"),
    st.sampled_from(["unknown", "_hidden", "", " ", "127.0.0.1", "10.1.2.3", "::ffff:10.0.0.1",
                     "1.2.3.4:99999", "[::1", "]", "\"[2001:db8::1]:80\"", "300.1.1.1"]),
    st.text(max_size=80),
)
forwarding = st.one_of(
    st.binary(max_size=300),
    st.binary(min_size=5000, max_size=70000),
    st.lists(ip_like, max_size=60).map(lambda hops: ", ".join(hops).encode("utf-8")),
    st.lists(st.tuples(st.sampled_from(["for", "FOR", "by", "proto", "", "for "]), ip_like),
             max_size=40).map(lambda pairs: ", ".join(
                 f"{k}={v}" if i % 2 else f"{k}=\"{v}\";proto=https" for i, (k, v) in
                 enumerate(pairs)).encode("utf-8")),
)
header_names = st.sampled_from([b"x-forwarded-for", b"forwarded", b"x-api-key", b"x-tier",
                                b"x-real-ip", b"host", b"cookie"])
headers = st.lists(st.tuples(header_names, forwarding), max_size=6)
paths = st.one_of(st.text(max_size=300).map(lambda text: "/" + text),
                  st.text(max_size=50),
                  st.sampled_from(["/", "/items/1", "/items/", "/items/a/b", "//items//1"]),
                  st.text(max_size=30).map(lambda text: "/items/" + text))
clients = st.one_of(st.none(),
                    st.tuples(st.sampled_from(["127.0.0.1", "10.9.9.9", "2001:db8::5"]),
                              st.integers(0, 65535)),
                    st.tuples(st.text(max_size=60), st.integers(-1, 70000)))


async def _call(app: ASGIApp, scope: dict[str, Any]) -> list[Message]:
    sent: list[Message] = []
    delivered = False

    async def receive() -> Message:
        nonlocal delivered
        if not delivered:
            delivered = True
            return {"type": "http.request", "body": b"", "more_body": False}
        await asyncio.sleep(0)
        return {"type": "http.disconnect"}

    async def send(message: Message) -> None:
        sent.append(message)

    await app(scope, receive, send)
    return sent


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(key=st.sampled_from(sorted(APPS)), header_list=headers, path=paths,
       raw_path=st.one_of(st.none(), st.binary(max_size=300)),
       method=st.one_of(st.sampled_from(["GET", "POST", "HEAD", "OPTIONS"]),
                        st.text(min_size=1, max_size=12)),
       client=clients, repeat=st.integers(1, 8))
def test_hostile_requests_never_make_a_500(
    key: str, header_list: list[tuple[bytes, bytes]], path: str, raw_path: bytes | None,
    method: str, client: tuple[str, int] | None, repeat: int,
) -> None:
    """Random forwarding headers, API keys, tiers, paths, methods and peers: an answer
    under 500 (a 429 with a digits-only Retry-After), never a 500 or an exception."""
    scope: dict[str, Any] = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
        "method": method, "scheme": "http", "path": path, "query_string": b"",
        "root_path": "", "headers": header_list, "client": client,
        "server": ("127.0.0.1", 8000),
    }
    if raw_path is not None:
        scope["raw_path"] = raw_path

    async def run() -> None:
        for _ in range(repeat):  # some of them get over the 3/minute and 5/minute limits
            sent = await _call(APPS[key], dict(scope))
            start = sent[0]
            assert start["type"] == "http.response.start"
            assert 200 <= start["status"] < 500, start  # 307 (Starlette's slash redirect) too
            if start["status"] == 429:
                retry = dict(start["headers"])[b"retry-after"]
                assert retry.isdigit()

    asyncio.run(run())


# --- configuration ---------------------------------------------------------------

def _toml_string(text: str) -> str:
    """A TOML basic string (hypothesis text has no surrogates)."""
    out = []
    for char in text:
        if char in "\"\\":
            out.append("\\" + char)
        elif ord(char) < 0x20 or ord(char) == 0x7F:
            out.append(f"\\u{ord(char):04X}")
        else:
            out.append(char)
    return '"' + "".join(out) + '"'


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value) if math.isfinite(value) else ("nan" if value != value else (
            "inf" if value > 0 else "-inf"))
    if isinstance(value, str):
        return _toml_string(value)
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{_toml_string(k)} = {_toml_value(v)}"
                               for k, v in value.items()) + "}"
    msg = f"no TOML for {value!r}"
    raise TypeError(msg)


def _toml(config: dict[str, Any]) -> str:
    """Top-level keys as ``key = value`` lines (tables inline): enough for these configs."""
    return "".join(f"{_toml_string(k)} = {_toml_value(v)}\n" for k, v in config.items())


def _baseline() -> dict[str, Any]:
    return {
        "storage_url": "memory://",
        "header_style": "legacy+draft-11",
        "failure_mode": "memory",
        "trusted_proxies": ["10.0.0.0/8"],
        "default_tier": "free",
        "tiers": {
            "free": {"limits": [{"rate": "10/minute", "algorithm": "token_bucket",
                                 "burst": 20, "name": "burst"},
                                {"rate": "1000/day", "name": "daily"}],
                     "concurrency": 5, "shadow": ["daily"]},
            "pro": {"limits": "100/minute; 10000/day", "algorithm": "gcra"},
        },
    }


short_text = st.text(max_size=20)  # pydantic shortens longer values in its messages
not_bool = st.one_of(short_text, st.integers(-(2**63), 2**63 - 1),
                     st.floats(allow_nan=False, allow_infinity=False))
toml_scalar = st.one_of(not_bool, st.booleans())
rate_text = st.one_of(
    st.text(max_size=40),
    st.from_regex(r"\A-?\d{0,22}\s*(/|per)?\s*\d{0,4}\s*(second|minute|hour|day|month)s?\Z"),
)
# (where in the config, the strategy of its bad value)
CORRUPTIONS: dict[str, Any] = {
    "tiers.free.limits.0.rate": st.one_of(rate_text, toml_scalar),
    "tiers.free.limits.0.algorithm": st.one_of(short_text, toml_scalar),
    # Booleans as counts: see test_a_boolean_count_is_refused_by_name.
    "tiers.free.limits.0.burst": not_bool,
    "tiers.free.limits.0.name": toml_scalar,
    "tiers.free.concurrency": not_bool,
    "tiers.free.shadow": st.lists(short_text, min_size=1, max_size=3),
    "tiers.pro.limits": st.one_of(rate_text, toml_scalar),
    "tiers.pro.algorithm": st.one_of(short_text, toml_scalar),
    "default_tier": toml_scalar,
    "header_style": st.one_of(short_text, toml_scalar),
    "failure_mode": st.one_of(short_text, toml_scalar),
    "trusted_proxies": st.lists(short_text, min_size=1, max_size=3),
    "storage_url": st.one_of(short_text, toml_scalar),
}


def _set(config: dict[str, Any], where: str, value: Any) -> None:
    *parents, last = where.split(".")
    node: Any = config
    for part in parents:
        node = node[int(part)] if isinstance(node, list) else node[part]
    if isinstance(node, list):
        node[int(last)] = value
    else:
        node[last] = value


def _named(message: str, value: Any) -> bool:
    """True when ``message`` names ``value`` (as repr, stripped, or in pydantic's words)."""
    if isinstance(value, list):
        # A list is named by the list, or by the (first) bad item in it.
        return repr(value) in message or any(_named(message, item) for item in value)
    if isinstance(value, str):
        candidates = [repr(value), repr(value.strip()), repr(value.strip().lower())]
        with contextlib.suppress(ValueError):
            candidates.append(str(int(value.strip())))  # pydantic made an int of "0"
    elif isinstance(value, bool):
        candidates = [repr(value), str(value).lower()]
    else:
        candidates = [repr(value), str(value)]
        if isinstance(value, float) and value.is_integer():
            candidates.append(str(int(value)))  # pydantic made an int of 0.0
    if any(candidate in message for candidate in candidates):
        return True
    # pydantic's own type errors show a long input shortened: its start then "...".
    return f"input_value={repr(value)[:12]}" in message


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), where=st.sampled_from(sorted(CORRUPTIONS)))
def test_a_bad_toml_value_is_refused_at_startup_by_name(data: st.DataObject, where: str) -> None:
    """One value of a valid TOML config replaced by a random one: the settings and the
    middleware either accept it, or refuse to start with an error naming that value."""
    value = data.draw(CORRUPTIONS[where], label=where)
    try:
        _load(where, value)
    except (ConfigError, ValidationError) as exc:
        assert _named(str(exc), value), f"{where}={value!r}: {exc}"


def _load(where: str, value: Any) -> RateLimitMiddleware:
    """The middleware from the baseline TOML config with ``value`` at ``where``."""
    config = _baseline()
    _set(config, where, value)
    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / "ratelimit.toml"
        path.write_text(_toml(config), encoding="utf-8")
        return RateLimitMiddleware(Starlette(), settings=RateLimitSettings.from_toml(path))


@pytest.mark.parametrize(("where", "value"), [("tiers.free.limits.0.burst", True),
                                              ("tiers.free.concurrency", False)])
def test_a_boolean_count_is_refused_by_name(where: str, value: bool) -> None:
    """``burst = true`` or ``concurrency = false`` is refused, naming true or false."""
    try:
        _load(where, value)
    except (ConfigError, ValidationError) as exc:
        message = str(exc)
    else:
        message = "(accepted)"
    assert _named(message, value), message


@settings(max_examples=200, deadline=None)
@given(rate=rate_text)
def test_a_bad_rate_is_refused_at_startup_by_name(rate: str) -> None:
    """A random rate string as the default limits, a tier or a route limit: accepted, or a
    ConfigError (or the settings' ValidationError) whose message quotes it."""
    builders: list[Callable[[], object]] = [
        lambda: RateLimitMiddleware(Starlette(), settings=RateLimitSettings(default_limits=rate)),
        lambda: Tier("t", rate),
        lambda: limit(rate),
    ]
    for build in builders:
        try:
            build()
        except (ConfigError, ValidationError) as exc:
            assert _named(str(exc), rate), f"{rate!r}: {exc}"

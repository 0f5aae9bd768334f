"""Keys: the client IP behind trusted proxies, API keys, authenticated users."""

from __future__ import annotations

import logging
import re
from typing import Any

import pytest
from fastapi import FastAPI, Header, HTTPException
from starlette.authentication import AuthCredentials, AuthenticationBackend, SimpleUser
from starlette.middleware.authentication import AuthenticationMiddleware
from starlette.requests import HTTPConnection

from ratelimit_mw import ConfigError, Hit, Limit, MemoryStorage
from ratelimit_mw.client_ip import ClientIP, TrustedProxies
from ratelimit_mw.identity import APIKey, AuthenticatedUser
from ratelimit_mw.middleware import RateLimitMiddleware
from ratelimit_mw.tiers import Tier, TierByAPIKey, TierFromHeader
from tests.conftest import FakeClock

from .conftest import client_for, make_app


def scope_from(peer: str | None, headers: list[tuple[str, str]] = ()) -> dict[str, Any]:  # type: ignore[assignment]
    return {
        "type": "http",
        "client": (peer, 1234) if peer is not None else None,
        "headers": [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in headers],
    }


@pytest.mark.parametrize(("trusted", "peer", "headers", "expected"), [
    # No proxy trusted: the peer, whatever the headers say.
    ([], "203.0.113.7", [("X-Forwarded-For", "1.2.3.4")], "ip:203.0.113.7"),
    # A trusted proxy: the rightmost untrusted hop.
    (["10.0.0.1"], "10.0.0.1", [("X-Forwarded-For", "1.2.3.4")], "ip:1.2.3.4"),
    (["10.0.0.0/8"], "10.0.0.1", [("X-Forwarded-For", "6.6.6.6, 1.2.3.4, 10.0.0.2")],
     "ip:1.2.3.4"),
    # An untrusted peer sending the header changes nothing.
    (["10.0.0.1"], "198.51.100.9", [("X-Forwarded-For", "1.2.3.4")], "ip:198.51.100.9"),
    # Every hop trusted: the leftmost one.
    (["10.0.0.0/8"], "10.0.0.1", [("X-Forwarded-For", "10.0.0.3, 10.0.0.2")], "ip:10.0.0.3"),
    # A trusted proxy without the header: the proxy itself.
    (["10.0.0.1"], "10.0.0.1", [], "ip:10.0.0.1"),
    # Garbage from a trusted proxy stops the walk at the last hop we believe.
    (["10.0.0.1"], "10.0.0.1", [("X-Forwarded-For", "not-an-ip")], "ip:10.0.0.1"),
    # IPv6 peers are grouped by /64; IPv4-mapped addresses are IPv4.
    ([], "2001:db8:1:2:3:4:5:6", [], "ip:2001:db8:1:2::/64"),
    ([], "::ffff:192.0.2.1", [], "ip:192.0.2.1"),
    # No client at all (a unix socket).
    ([], None, [], "ip:-"),
    # A dual-stack socket shows the IPv4 proxy as ::ffff:127.0.0.1: still the proxy.
    (["127.0.0.1"], "::ffff:127.0.0.1", [("X-Forwarded-For", "192.0.2.1")], "ip:192.0.2.1"),
    (["10.0.0.0/8"], "10.0.0.1", [("X-Forwarded-For", "192.0.2.9, ::ffff:10.0.0.2")],
     "ip:192.0.2.9"),
    # Obfuscated identifiers are RFC 7239's, not X-Forwarded-For's.
    (["10.0.0.1"], "10.0.0.1", [("X-Forwarded-For", "_client-a")], "ip:10.0.0.1"),
])
def test_client_ip(trusted: list[str], peer: str | None, headers: list[tuple[str, str]],
                   expected: str) -> None:
    """The client IP follows forwarding headers only from trusted proxies."""
    assert ClientIP(trusted)(scope_from(peer, headers)) == expected


@pytest.mark.parametrize(("value", "expected"), [
    # RFC 7239, with quotes, ports and IPv6 brackets.
    ('for="[2001:db8::1]:4711";proto=https', "ip:2001:db8::/64"),
    ("for=192.0.2.60:8080, for=10.0.0.1", "ip:192.0.2.60"),
    ("For=192.0.2.60;by=10.0.0.1", "ip:192.0.2.60"),
    # Garbage from a trusted proxy stops the walk at the last hop we believe.
    ("for", "ip:10.0.0.1"),
    ("for=unknown", "ip:10.0.0.1"),
    # An IPv4-mapped hop is its IPv4 address, here the trusted proxy.
    ('for=192.0.2.9, for="[::ffff:10.0.0.1]"', "ip:192.0.2.9"),
    # ',' and ';' inside a quoted-string (which a client's Host can fill) split nothing.
    ('for=192.0.2.60;host="example.com,for=6.6.6.6"', "ip:192.0.2.60"),
    ('for=192.0.2.61;host="a;for=7.7.7.7"', "ip:192.0.2.61"),
    ('for="[2001:db8::1]:4711";proto=https;host="x,y"', "ip:2001:db8::/64"),
    ('for=192.0.2.62;host="a\\",for=6.6.6.6"', "ip:192.0.2.62"),
    ('for="192.0.2.\\63"', "ip:192.0.2.63"),
    # A malformed element (an unbalanced quote, text after one) stops the walk.
    # A client's unbalanced quote: the element the proxy appended is still read.
    ('for=6.6.6.6;host="a, for=192.0.2.64', "ip:192.0.2.64"),
    ('for=6.6.6.6;host="a,"b, for=192.0.2.65', "ip:192.0.2.65"),
    ('for=", for=192.0.2.66', "ip:192.0.2.66"),
    ('for=198.51.100.9;by="x, for=192.0.2.67', "ip:192.0.2.67"),
    ('for=1.1.1.1;host="a,b",' + "for=1.1.1.1," * 300 + " for=192.0.2.68", "ip:192.0.2.68"),
    # Hostile prefixes, read in bounded time (only the header's end, a few quoted-strings
    # and escapes): the proxy's element is still read.
    ('for="' + '\\"' * 40_000 + '", for=192.0.2.69', "ip:192.0.2.69"),
    ('x="a";' * 20_000 + ", for=192.0.2.70", "ip:192.0.2.70"),
    ("for=" + ";" * 80_000 + ", for=192.0.2.71", "ip:192.0.2.71"),
    # RFC 7239 section 6.3: an obfuscated node is a client of its own; "unknown" is not.
    ("for=_client-a", "ip:_client-a"),
    ('for="_hidden:_port"', "ip:_hidden"),
    ("for=_hidden, for=10.0.0.1", "ip:_hidden"),
    ("for=_", "ip:10.0.0.1"),
    ("for=_no!", "ip:10.0.0.1"),
])
def test_client_ip_from_forwarded(value: str, expected: str) -> None:
    """Behind proxies that set ``Forwarded``: its ``for=`` nodes, right to left."""
    client_ip = ClientIP(["10.0.0.1"], forwarded_header="Forwarded")
    assert client_ip(scope_from("10.0.0.1", [("Forwarded", value)])) == expected


@pytest.mark.parametrize("value", [
    '"' * 10_000,
    'for="' + "a" * 10_000,
    'for=192.0.2.1;host="\\' * 3_000,
    'for=6.6.6.6;host="\xff\xe9,", for=\xff\xe9',
    'for="' + "\\" * 10_000,
    # An element of more pairs than a proxy writes, with separators in quoted-strings.
    'x=",";' + ";" * 10_000 + "for=6.6.6.6",
])
def test_hostile_forwarded_headers_key_by_the_proxy(value: str) -> None:
    """A long, unbalanced or non-ASCII Forwarded header never raises: it keys the
    request by the last hop believed, the proxy."""
    client_ip = ClientIP(["10.0.0.1"], forwarded_header="forwarded")
    assert client_ip(scope_from("10.0.0.1", [("Forwarded", value)])) == "ip:10.0.0.1"


def test_an_ipv4_mapped_trusted_proxy_does_not_warn(caplog: pytest.LogCaptureFixture) -> None:
    """The trusted 127.0.0.1, seen as ::ffff:127.0.0.1, is no untrusted peer to warn of."""
    ClientIP(["127.0.0.1"])(scope_from("::ffff:127.0.0.1", [("X-Forwarded-For", "192.0.2.1")]))
    assert "not a trusted proxy" not in caplog.text


@pytest.mark.parametrize(("header", "expected"), [
    ("x-forwarded-for", "ip:192.0.2.1"), ("forwarded", "ip:192.0.2.2")])
def test_only_the_header_the_proxies_set_is_believed(header: str, expected: str) -> None:
    """A proxy appends to its own forwarding header and passes the other one on as the
    client sent it: only the configured one is read, so the other can't pick the key."""
    headers = [("X-Forwarded-For", "6.6.6.6, 192.0.2.1"),
               ("Forwarded", "for=6.6.6.7, for=192.0.2.2")]
    client_ip = ClientIP(["10.0.0.0/8"], forwarded_header=header)
    assert client_ip(scope_from("10.0.0.1", headers)) == expected
    assert client_ip(scope_from("10.0.0.1", headers[::-1][:1] if header == "x-forwarded-for"
                                else headers[:1])) == "ip:10.0.0.1"


@pytest.mark.parametrize("value", ["x-real-ip", "", None, 1, "forwarded-for"])
def test_a_bad_forwarded_header_fails_naming_it(value: object) -> None:
    with pytest.raises(ConfigError, match=f"forwarded_header must be .*got {value!r}"):
        ClientIP(forwarded_header=value)


def test_ipv6_prefix_is_configurable() -> None:
    """ipv6_prefix=128 keeps whole IPv6 addresses apart."""
    key = ClientIP(ipv6_prefix=128)(scope_from("2001:db8::1"))
    assert key == "ip:2001:db8::1"


@pytest.mark.parametrize("prefix", [0, 129, 64.0, "64", True, None])
def test_bad_ipv6_prefix_is_a_config_error(prefix: object) -> None:
    """A prefix that is not a whole number of bits from 1 to 128 fails at start-up,
    naming the value (the compiled build too)."""
    with pytest.raises(ConfigError, match=f"ipv6_prefix must be .*got {re.escape(repr(prefix))}"):
        ClientIP(ipv6_prefix=prefix)


@pytest.mark.parametrize("header", ["", "  ", 5, None, "x-k\u20acy", "bad header", "x:y"])
def test_bad_api_key_header_is_a_config_error(header: object) -> None:
    """The API key header must be a header name a request can carry, or start-up fails
    naming it (not a UnicodeEncodeError, not a limiter that never finds its key)."""
    with pytest.raises(ConfigError, match=f"API key header must be an HTTP header name.*"
                                          f"got {re.escape(repr(header))}"):
        APIKey(header)
    with pytest.raises(ConfigError, match="tier header must be an HTTP header name"):
        TierFromHeader(header)


def test_a_client_host_that_is_not_a_string_still_gets_a_key() -> None:
    """A server that puts something odd in ``client`` gets a key, not an exception."""
    assert ClientIP()({"type": "http", "client": (2130706433, 80), "headers": []}) == (
        "ip:2130706433")


def test_many_clients_each_keep_their_own_key() -> None:
    """Keys stay right past the size of the key cache (it is emptied, not corrupted), for
    peers and for clients forwarded by a trusted proxy alike."""
    direct, behind = ClientIP(), ClientIP(["10.0.0.1"])
    for n in range(9000):
        address = f"198.51.{n // 256}.{n % 256}"
        assert direct(scope_from(address)) == f"ip:{address}"
        assert behind(scope_from("10.0.0.1", [("X-Forwarded-For", address)])) == f"ip:{address}"
    assert direct(scope_from("10.0.0.1", [("X-Forwarded-For", "1.2.3.4")])) == "ip:10.0.0.1"


def test_bad_trusted_proxy_is_a_config_error() -> None:
    """A trusted proxy that is not an address or network fails at start-up."""
    with pytest.raises(ConfigError, match="trusted proxy"):
        TrustedProxies(["10.0.0.300"])


def test_trusting_everyone_warns(caplog: pytest.LogCaptureFixture) -> None:
    """Trusting '*' logs a warning at start-up."""
    ClientIP("*")
    assert "every peer is a trusted proxy" in caplog.text


def test_untrusted_forwarding_headers_warn_once(caplog: pytest.LogCaptureFixture) -> None:
    """Forwarding headers from an untrusted peer warn once, when proxies are configured."""
    key = ClientIP(["10.0.0.1"])
    for _ in range(3):
        key(scope_from("198.51.100.9", [("X-Forwarded-For", "1.2.3.4")]))
    warnings = [r for r in caplog.records if "not a trusted proxy" in r.getMessage()]
    assert len(warnings) == 1
    assert warnings[0].levelno == logging.WARNING


async def test_spoofed_forwarded_for_does_not_change_the_key(
    clock: FakeClock, memory: MemoryStorage,
) -> None:
    """An untrusted client rotating X-Forwarded-For stays one key and gets limited."""
    app = make_app(tiers=[Tier("t", "2/minute")], storage=memory, clock=clock,
                   trusted_proxies=["10.0.0.1"])
    async with client_for(app) as client:
        codes = [(await client.get("/", headers={"x-forwarded-for": f"1.2.3.{i}"})).status_code
                 for i in range(4)]
    assert codes == [200, 200, 429, 429]


@pytest.mark.parametrize(("trusted", "peer", "header", "values"), [
    ("10.0.0.1", "10.0.0.1", "x-forwarded-for", ["1.1.1.1", "2.2.2.2", "1.1.1.1"]),
    # A dual-stack socket shows the proxy at 127.0.0.1 as ::ffff:127.0.0.1.
    (["127.0.0.1"], "::ffff:127.0.0.1", "x-forwarded-for",
     ["192.0.2.1", "192.0.2.2", "192.0.2.1"]),
    # A proxy that hides addresses behind RFC 7239 obfuscated nodes.
    (["10.0.0.1"], "10.0.0.1", "forwarded", ["for=_client-a", "for=_client-b", "for=_client-a"]),
])
async def test_trusted_proxy_forwards_distinct_clients(
    trusted: str | list[str], peer: str, header: str, values: list[str],
    clock: FakeClock, memory: MemoryStorage,
) -> None:
    """Behind a trusted proxy each forwarded client has its own quota."""
    app = make_app(tiers=[Tier("t", "1/minute")], storage=memory, clock=clock,
                   trusted_proxies=trusted, forwarded_header=header)
    async with client_for(app, (peer, 5)) as proxy:
        codes = [(await proxy.get("/", headers={header: value})).status_code
                 for value in values]
    assert codes == [200, 200, 429]


def test_api_key_is_hashed_and_falls_back_to_ip() -> None:
    """An API key becomes a digest (never stored in clear); without one, the client IP."""
    key = APIKey("X-API-Key")
    with_key = key(scope_from("203.0.113.7", [("X-API-Key", "secret-123")]))
    assert with_key is not None and with_key.startswith("apikey:")
    assert "secret-123" not in with_key
    assert with_key == key(scope_from("198.51.100.1", [("x-api-key", " secret-123 ")]))
    assert key(scope_from("203.0.113.7")) == "ip:203.0.113.7"


async def test_api_key_keys_requests(clock: FakeClock, memory: MemoryStorage) -> None:
    """key='api_key' counts per API key, whatever the IP."""
    app = make_app(tiers=[Tier("t", "1/minute")], storage=memory, clock=clock, key="api_key")
    async with client_for(app) as one, client_for(app, ("198.51.100.1", 1)) as two:
        assert (await one.get("/", headers={"x-api-key": "k1"})).status_code == 200
        assert (await two.get("/", headers={"x-api-key": "k1"})).status_code == 429
        assert (await two.get("/", headers={"x-api-key": "k2"})).status_code == 200


def test_a_repeated_api_key_header_keys_by_its_first_value() -> None:
    """The key is the first value, the one Starlette and FastAPI read: a valid key sent
    again beside a made-up one is still that key (joined, each made-up value got a new
    counter while the app authenticated the valid key)."""
    key = APIKey("X-API-Key")
    alone = key(scope_from("203.0.113.7", [("X-API-Key", "good")]))
    for other in ("r1", "r2", ""):
        assert key(scope_from("203.0.113.7", [("X-API-Key", "good"), ("X-API-Key", other)])) \
            == alone


async def test_a_repeated_api_key_header_cannot_dodge_the_limit(
    clock: FakeClock, memory: MemoryStorage,
) -> None:
    """Through FastAPI: the endpoint checks ``Header()`` (the first value), and a second
    made-up header does not get the valid key a fresh counter."""
    app = FastAPI()

    @app.get("/")
    async def index(x_api_key: str = Header()) -> dict[str, str]:
        if x_api_key != "good":
            raise HTTPException(401)
        return {"key": x_api_key}

    app.add_middleware(RateLimitMiddleware, tiers=[Tier("t", "2/minute")], storage=memory,
                       clock=clock, key="api_key")
    async with client_for(app) as client:
        statuses = []
        for i in range(4):
            response = await client.get("/", headers=[("X-API-Key", "good"),
                                                      ("X-API-Key", f"r{i}")])
            statuses.append(response.status_code)
    assert statuses == [200, 200, 429, 429]


def test_a_repeated_tier_header_names_the_tier_of_its_first_value() -> None:
    """Tiers by API key and by header read the first value too."""
    by_key = TierByAPIKey({"good": "pro"})
    assert by_key(scope_from("203.0.113.7", [("X-API-Key", "good"), ("X-API-Key", "x")])) \
        == "pro"
    by_header = TierFromHeader("x-plan", allowed=["pro"])
    assert by_header(scope_from("203.0.113.7", [("X-Plan", "pro"), ("X-Plan", "free")])) \
        == "pro"


class _HeaderAuth(AuthenticationBackend):
    async def authenticate(self, conn: HTTPConnection) -> tuple[AuthCredentials, SimpleUser] | None:
        name = conn.headers.get("x-user")
        return (AuthCredentials(["authenticated"]), SimpleUser(name)) if name else None


async def test_authenticated_user_key(clock: FakeClock, memory: MemoryStorage) -> None:
    """key='user' counts per authenticated user; anonymous requests per IP."""
    app = make_app(tiers=[Tier("t", "1/minute")], storage=memory, clock=clock, key="user")
    app.add_middleware(AuthenticationMiddleware, backend=_HeaderAuth())
    async with client_for(app) as client:
        assert (await client.get("/", headers={"x-user": "alice"})).status_code == 200
        assert (await client.get("/", headers={"x-user": "alice"})).status_code == 429
        assert (await client.get("/", headers={"x-user": "bob"})).status_code == 200
        assert (await client.get("/")).status_code == 200
        assert (await client.get("/")).status_code == 429


def test_user_key_without_user_is_ip() -> None:
    """Without scope['user'] the user key is the client IP."""
    assert AuthenticatedUser()(scope_from("203.0.113.7")) == "ip:203.0.113.7"


def _raise_key(scope: Any) -> str:
    raise KeyError("x-tenant")


async def _raise_key_async(scope: Any) -> str:
    raise RuntimeError("auth service down")


def _raise_tier(scope: Any) -> str:
    raise ValueError("no plan")


async def _raise_tier_async(scope: Any) -> str:
    raise LookupError("billing unreachable")


@pytest.mark.parametrize("key", [_raise_key, _raise_key_async])
async def test_a_key_function_that_raises_keys_by_client_ip(
    key: Any, clock: FakeClock, memory: MemoryStorage, caplog: pytest.LogCaptureFixture,
) -> None:
    """A custom key function that raises is no 500: the request is keyed by its client IP
    (so it is still limited), and the failure is logged once with its traceback, then
    at most once a minute."""
    app = make_app(tiers=[Tier("t", "2/minute")], storage=memory, clock=clock, key=key)
    with caplog.at_level(logging.ERROR, logger="ratelimit_mw"):
        async with client_for(app) as one, client_for(app, ("198.51.100.1", 1)) as two:
            codes = [(await one.get("/")).status_code for _ in range(3)]
            other = await two.get("/")
    assert codes == [200, 200, 429]
    assert other.status_code == 200
    seen = await memory.peek("ip:203.0.113.7", [Hit(Limit("2/minute"))])
    assert seen.decisions[0].remaining == 0  # counted under the client IP
    failures = [r for r in caplog.records if "key function" in r.getMessage()]
    assert len(failures) == 1 and failures[0].exc_info is not None
    assert "client IP" in failures[0].getMessage()


@pytest.mark.parametrize("resolver", [_raise_tier, _raise_tier_async])
async def test_a_tier_resolver_that_raises_gives_the_default_tier(
    resolver: Any, clock: FakeClock, memory: MemoryStorage, caplog: pytest.LogCaptureFixture,
) -> None:
    """A tier resolver that raises is no 500: the request gets the default tier."""
    tiers = [Tier("free", "1/minute"), Tier("pro", "100/minute")]
    app = make_app(tiers=tiers, storage=memory, clock=clock, tier_resolver=resolver,
                   default_tier="free")
    with caplog.at_level(logging.ERROR, logger="ratelimit_mw"):
        async with client_for(app) as client:
            codes = [(await client.get("/")).status_code for _ in range(2)]
    assert codes == [200, 429]
    assert [r for r in caplog.records if "tier resolver" in r.getMessage()]

"""The client's address: the peer, or behind trusted proxies the client they forwarded for.

As uvicorn's ``ProxyHeadersMiddleware`` does, the forwarding header is believed only
from trusted proxies and walked right to left; unlike it, RFC 7239's ``Forwarded`` is
read too, and a hostile header costs a bounded amount of work.
"""

from __future__ import annotations

import functools
import ipaddress
import logging
import re
from collections.abc import Iterable
from typing import Final

from mypy_extensions import mypyc_attr
from starlette.types import Scope

from .asgi import header_value
from .errors import ConfigError

__all__ = ["FORWARDED_HEADERS", "ClientIP", "TrustedProxies", "check_forwarded_header"]

_log = logging.getLogger("ratelimit_mw")
_IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
_MAX_HOPS: Final = 32  # a longer forwarding chain is hostile; walk no further than this
_MAX_TOKEN: Final = 64  # an address longer than this is not an address
_MAX_HEADER: Final = _MAX_HOPS * 256  # of a forwarding header, only this much of its end is read


@mypyc_attr(allow_interpreted_subclasses=True)
class TrustedProxies:
    """The peers whose forwarding headers are believed: addresses, networks, or ``*``.

    >>> "10.1.2.3" in TrustedProxies(["10.0.0.0/8"])
    True
    """

    __slots__ = ("_cache", "everyone", "networks")

    def __init__(self, proxies: Iterable[str] | str = ()) -> None:
        items = [p.strip() for p in proxies.split(",")] if isinstance(proxies, str) else [
            str(p).strip() for p in proxies]
        items = [item for item in items if item]
        self.everyone = "*" in items
        networks: list[_IPNetwork] = []
        for item in items:
            if item == "*":
                continue
            try:
                network = ipaddress.ip_network(item, strict=False)
            except ValueError as exc:
                msg = (f"couldn't parse trusted proxy {item!r}; expected an IP address, "
                       f"a network such as '10.0.0.0/8', or '*'")
                raise ConfigError(msg) from exc
            if "/" in item and network.network_address != _address(item.split("/", 1)[0]):
                # 10.0.0.1/8 would silently trust all of 10.0.0.0/8.
                msg = (f"trusted proxy {item!r} has host bits set; write the network "
                       f"{str(network)!r}, or the one address {item.split('/', 1)[0]!r}")
                raise ConfigError(msg)
            networks.append(network)
        self.networks = tuple(networks)
        self._cache: dict[str, bool] = {}

    def __bool__(self) -> bool:
        return self.everyone or bool(self.networks)

    def __contains__(self, host: object) -> bool:
        if self.everyone:
            return True
        if not isinstance(host, str):
            return False
        known = self._cache.get(host)
        if known is None:
            known = self._compute(host)
            if len(self._cache) >= 4096:
                self._cache.clear()
            self._cache[host] = known
        return known

    def _compute(self, host: str) -> bool:
        try:
            address = ipaddress.ip_address(host)
        except ValueError:
            return False
        # A dual-stack socket shows an IPv4 peer as ::ffff:a.b.c.d: the same host.
        mapped = address.ipv4_mapped if isinstance(address, ipaddress.IPv6Address) else None
        return any(address in network or (mapped is not None and mapped in network)
                   for network in self.networks)

    def __repr__(self) -> str:
        shown = ["*"] if self.everyone else [str(n) for n in self.networks]
        return f"TrustedProxies({shown!r})"


@functools.lru_cache(maxsize=8192)
def _group(host: str, ipv6_prefix: int) -> str | None:
    """The canonical address, an IPv6 one reduced to its /``ipv6_prefix`` network."""
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            return str(address.ipv4_mapped)
        if ipv6_prefix < 128:
            return str(ipaddress.IPv6Network((address, ipv6_prefix), strict=False))
    return str(address)


def _ip_key(peer: str, ipv6_prefix: int) -> str:
    """The key of a client address: ``ip:`` and the address, grouped (``ip:-``: none)."""
    grouped = _group(peer, ipv6_prefix) if peer else None
    return f"ip:{grouped or peer[:_MAX_TOKEN] or '-'}"


# One forwarded-pair and the ';' after it (RFC 7239 section 4): the value a token or an
# RFC 9110 quoted-string, inside which ';' separates nothing. Possessive, so an
# unbalanced quote fails at once; spaces around '=' are tolerated, as before.
_PAIR = re.compile(r'[ \t]*(?:([^\s=,;"]+)[ \t]*=[ \t]*'
                   r'("[^"\\]*+(?:\\.[^"\\]*+)*+"|[^\s,;"]*))?[ \t]*(;|\Z)')
_QUOTED_PAIR = re.compile(r"\\(.)")
_MAX_PAIRS: Final = 16  # an element has four parameters (for, by, host, proto) and few more
_MAX_QUOTED: Final = 4 * _MAX_HOPS  # quoted-strings in the elements read, at most
# RFC 7239 section 6.3: an obfuscated node, sent instead of the address a proxy hides.
_OBFNODE = re.compile(r"_[A-Za-z0-9._-]+")


def _forwarded_for(value: str) -> list[str]:
    """The ``for=`` node of each of the last elements of an RFC 7239 ``Forwarded``
    header, in order (``""`` for an element without one, or malformed)."""
    cut = len(value) > _MAX_HEADER
    if cut:  # read the end, where the hops that may be believed are
        value = value[-_MAX_HEADER:]
    nodes = _forwarded_nodes(value)
    if cut:
        nodes[0] = ""  # a piece of an element, maybe: the walk goes no further
    return nodes


def _forwarded_nodes(value: str) -> list[str]:
    if '"' in value and not _splits_plainly(value):
        return [_quoted_for(element) for element in _elements_from_the_right(value)]
    # The usual header: every ',' and ';' separates (none is inside a quoted-string).
    nodes = []
    for element in value.rsplit(",", _MAX_HOPS)[-_MAX_HOPS:]:
        node = ""
        pairs = element.split(";", _MAX_PAIRS)
        if len(pairs) > _MAX_PAIRS:  # more pairs than any proxy writes: hostile
            pairs = ["for=_"]
        for pair in pairs:
            name, _, token = pair.partition("=")
            if name.strip(" \t").lower() == "for":
                node = token.strip(" \t")
                if len(node) > 1 and node[0] == node[-1] == '"':
                    node = node[1:-1]
        nodes.append(_strip_port(node))
    return nodes


def _splits_plainly(value: str) -> bool:
    """True when no quoted-string of ``value`` holds a ',', a ';' or a quoted-pair, and
    none is left open: then splitting on ',' and ';' parses it (``for="[::1]:80"``)."""
    parts = value.split('"')
    quoted = "".join(parts[1::2])
    return len(parts) % 2 == 1 and "," not in quoted and ";" not in quoted and "\\" not in value


def _elements_from_the_right(value: str) -> list[str]:
    """The last ``_MAX_HOPS`` elements of a header with quoted-strings, split at the
    commas outside them, found from the right: the elements a trusted proxy appended
    are read whatever a client put before them (an unbalanced quote, say). An element
    with an unbalanced quote ends the list (on its left)."""
    elements: list[str] = []
    end = scan = len(value)
    comma = value.rfind(",", 0, scan)
    quoted = 0
    while len(elements) < _MAX_HOPS:
        # Each search looks only where no other has: linear, however hostile the header.
        quote = value.rfind('"', comma + 1, scan)
        if quote >= 0:  # a quoted-string ends after the comma: skip to its start
            quoted += 1
            if quoted > _MAX_QUOTED:  # more than the hops could hold: hostile
                elements.append('for="')
                break
            scan = _opening_quote(value, quote)
            if scan < 0:
                elements.append('for="')  # unbalanced: read as malformed, and no further
                break
            if scan < comma:  # the comma was inside it
                comma = value.rfind(",", 0, scan)
            continue
        elements.append(value[comma + 1:end])
        if comma < 0:
            break
        end = scan = comma
        comma = value.rfind(",", 0, scan)
    elements.reverse()
    return elements


def _opening_quote(value: str, closing: int) -> int:
    """Where the quoted-string that ends at ``closing`` starts (the nearest quote on the
    left not escaped by a backslash), or -1 (none, or too many escaped ones)."""
    at = closing
    for _ in range(_MAX_QUOTED):  # escaped quotes in one quoted-string: a few at most
        at = value.rfind('"', 0, at)
        if at < 0:
            return -1
        before = value[max(0, at - 64):at]
        escapes = len(before) - len(before.rstrip("\\"))
        if escapes == 64:
            return -1  # a run of backslashes that long: hostile
        if escapes % 2 == 0:
            return at
    return -1


def _quoted_for(element: str) -> str:
    """The ``for=`` node of one element with quoted-strings, read pair by pair (``""``
    when there is none, or the element is malformed)."""
    node = ""
    pos = 0
    for _ in range(_MAX_PAIRS):
        pair = _PAIR.match(element, pos)
        if pair is None:
            return ""
        name, token, separator = pair.groups()
        if name is not None and name.lower() == "for":
            node = token
            if node.startswith('"'):
                node = node[1:-1]
                if "\\" in node:
                    node = _QUOTED_PAIR.sub(_escaped, node)
        if not separator:
            return _strip_port(node)
        pos = pair.end()
    return ""  # more pairs than any proxy writes: hostile


def _escaped(pair: re.Match[str]) -> str:
    """The character a quoted-pair (``\\"``) stands for."""
    return pair[1]


def _strip_port(node: str) -> str:
    """``[2001:db8::1]:4711`` -> ``2001:db8::1``; ``192.0.2.1:80`` -> ``192.0.2.1``."""
    if node.startswith("["):
        return node[1:].partition("]")[0]
    if node.count(":") == 1:
        return node.partition(":")[0]
    return node


@mypyc_attr(allow_interpreted_subclasses=True)
class ClientIP:
    """The client's address: the peer, or, behind trusted proxies, the forwarded client.

    ``forwarded_header``, the header your proxies set (``X-Forwarded-For``, or RFC
    7239's ``Forwarded``), is read only when the peer is a trusted proxy, and walked
    right to left: the first hop that is not a trusted proxy is the client. The other
    header is never read: a proxy passes on what the client sent in it, so a client
    could pick its own key with it. IPv6 clients are grouped by ``/ipv6_prefix`` (a /64
    belongs to one subscriber), so rotating through one's own addresses gains nothing.
    """

    __slots__ = ("_header", "_keys", "_warned", "ipv6_prefix", "trusted")

    # ipv6_prefix typed object: see ``checks``.
    def __init__(
        self, trusted_proxies: TrustedProxies | Iterable[str] | str = (), *,
        ipv6_prefix: object = 64, forwarded_header: object = "x-forwarded-for",
    ) -> None:
        if isinstance(ipv6_prefix, bool) or not isinstance(ipv6_prefix, int) or not (
                1 <= ipv6_prefix <= 128):
            msg = f"ipv6_prefix must be an integer from 1 to 128, got {ipv6_prefix!r}"
            raise ConfigError(msg)
        self._header = check_forwarded_header(forwarded_header).encode()
        self.trusted = (trusted_proxies if isinstance(trusted_proxies, TrustedProxies)
                        else TrustedProxies(trusted_proxies))
        self.ipv6_prefix: int = ipv6_prefix
        self._warned = False
        self._keys: dict[str, str] = {}  # peer (or forwarded client) -> key
        if self.trusted.everyone:
            _log.warning(
                "ratelimit_mw: every peer is a trusted proxy ('*'); any client can choose "
                "its own rate-limit key with %s. Trust only your proxies' addresses.",
                self.forwarded_header)

    def __call__(self, scope: Scope) -> str:
        client = scope.get("client")
        peer = client[0] if client else ""
        if not isinstance(peer, str):  # a server's odd client tuple is not a 500
            peer = str(peer)
        if self.trusted:
            if peer in self.trusted:
                peer = self._forwarded_client(scope, peer)
            elif not self._warned:
                self._warn_untrusted(scope, peer)
        keys = self._keys
        key = keys.get(peer)
        if key is None:
            if len(keys) >= 8192:
                keys.clear()
            key = keys[peer] = _ip_key(peer, self.ipv6_prefix)
        return key

    @property
    def forwarded_header(self) -> str:
        """The forwarding header believed from trusted proxies."""
        return self._header.decode()

    def _forwarded_client(self, scope: Scope, peer: str) -> str:
        """Walk the forwarding chain from the right; the first untrusted hop is the client."""
        value = header_value(scope, self._header)
        if value is None:
            return peer
        forwarded = self._header == b"forwarded"
        if forwarded:
            hops = _forwarded_for(value)
        else:
            hops = [_strip_port(hop.strip()) for hop in value.rsplit(",", _MAX_HOPS)[-_MAX_HOPS:]]
        client = peer
        for hop in reversed(hops):
            if len(hop) > _MAX_TOKEN or (_group(hop, 128) is None and not (
                    forwarded and _OBFNODE.fullmatch(hop))):
                # A trusted proxy passed on garbage: stop at the last hop we believe.
                return client
            client = hop
            if hop not in self.trusted:
                return hop
        return client

    def _warn_untrusted(self, scope: Scope, peer: str) -> None:
        """Warn once that forwarding headers came from a peer we don't trust."""
        for name, _ in scope["headers"]:
            if name in (b"x-forwarded-for", b"forwarded"):
                self._warned = True
                _log.warning(
                    "ratelimit_mw: forwarding headers from %s, which is not a trusted proxy, "
                    "were ignored (trusted: %r); if it is your proxy, add it to "
                    "trusted_proxies", peer or "an unknown peer", self.trusted)
                return

    def __repr__(self) -> str:
        return (f"ClientIP({self.trusted!r}, ipv6_prefix={self.ipv6_prefix}, "
                f"forwarded_header={self.forwarded_header!r})")


FORWARDED_HEADERS = ("x-forwarded-for", "forwarded")


def check_forwarded_header(value: object) -> str:
    """``x-forwarded-for`` or ``forwarded`` (any case): the header trusted proxies set."""
    name = value.strip().lower() if isinstance(value, str) else None
    if name not in FORWARDED_HEADERS:
        msg = (f"forwarded_header must be 'x-forwarded-for' or 'forwarded' (the header your "
               f"proxies set), got {value!r}")
        raise ConfigError(msg)
    return name


def _address(text: str) -> object:
    try:
        return ipaddress.ip_address(text)
    except ValueError:
        return None

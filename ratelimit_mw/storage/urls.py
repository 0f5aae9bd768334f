"""Storage URLs: parsing them, checking their options, and naming them without passwords."""

from __future__ import annotations

import difflib
import inspect
import math
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple, NoReturn
from urllib.parse import parse_qsl, unquote, urlsplit

from redis.asyncio.connection import (
    URL_QUERY_ARGUMENT_PARSERS,
    AbstractConnection,
    Connection,
    SSLConnection,
)

from ..errors import ConfigError

__all__ = [
    "CONNECTION_OPTIONS",
    "TLS_OPTIONS",
    "NodesURL",
    "bad_url",
    "check_redis_url",
    "connection_options",
    "memory_options",
    "parse_nodes_url",
    "redacted",
]


class NodesURL(NamedTuple):
    """A URL naming several servers: ``scheme://[user:password@]h:p,h:p/path?query``."""

    scheme: str
    username: str | None
    password: str | None
    hosts: tuple[tuple[str, int], ...]
    path: str
    query: dict[str, str]


def parse_nodes_url(url: str, schemes: tuple[str, ...], *, default_port: int,
                    example: str) -> NodesURL:
    """Split a several-hosts URL, or raise ``ConfigError`` naming it."""
    if not isinstance(url, str) or "://" not in url:
        bad_url(url, "not a URL", example)
    scheme, rest = url.split("://", 1)
    if scheme.lower() not in schemes:
        bad_url(url, f"the scheme must be one of {', '.join(schemes)}", example)
    rest, _, query_text = rest.partition("?")
    netloc, _, path = rest.partition("/")
    userinfo, _, host_list = netloc.rpartition("@")
    username, has_password, password = userinfo.partition(":")
    hosts = tuple(_host_port(url, item, default_port, example) for item in host_list.split(","))
    try:
        pairs = parse_qsl(query_text, keep_blank_values=True, strict_parsing=bool(query_text))
    except ValueError as exc:
        bad_url(url, f"malformed query: {exc}", example, cause=exc)
    query = dict(pairs)
    if len(query) != len(pairs):
        bad_url(url, "an option is given twice", example)
    return NodesURL(scheme.lower(), unquote(username) or None,
                    unquote(password) if has_password else None,
                    hosts, unquote(path.rstrip("/")), query)


def _host_port(url: str, item: str, default_port: int, example: str) -> tuple[str, int]:
    """``host``, ``host:port`` or ``[v6]:port``."""
    if item.startswith("["):
        host, _, tail = item[1:].partition("]")
        if tail and not tail.startswith(":"):
            bad_url(url, f"bad address {item!r}", example)
        port_text = tail[1:]
    else:
        host, _, port_text = item.partition(":")
        if ":" in port_text:
            bad_url(url, f"write the IPv6 address {item!r} in brackets", example)
    if not host:
        bad_url(url, "every address needs a host", example)
    if not port_text:
        return host, default_port
    if not port_text.isascii() or not port_text.isdigit() or not 0 < int(port_text) < 65536:
        bad_url(url, f"bad port in {item!r}", example)
    return host, int(port_text)


def _seconds(text: str) -> float:
    value = float(text)
    if not math.isfinite(value) or value <= 0:
        msg = "must be a positive number of seconds"
        raise ValueError(msg)
    return value


def _count(text: str) -> int:
    value = int(text)
    if value < 1:
        msg = "must be a positive integer"
        raise ValueError(msg)
    return value


def _flag(text: str) -> bool:
    words = {"true": True, "yes": True, "1": True, "false": False, "no": False, "0": False}
    if text.lower() not in words:
        msg = "must be true or false"
        raise ValueError(msg)
    return words[text.lower()]


CONNECTION_OPTIONS: dict[str, Callable[[str], Any]] = {
    "username": str, "password": str, "client_name": str,
    "socket_timeout": _seconds, "socket_connect_timeout": _seconds,
    "max_connections": _count, "health_check_interval": _seconds,
}
TLS_OPTIONS: dict[str, Callable[[str], Any]] = {
    "ssl_ca_certs": str, "ssl_certfile": str, "ssl_keyfile": str, "ssl_cert_reqs": str,
    "ssl_check_hostname": _flag,
}


def connection_options(
    url: str, parsed: NodesURL, allowed: Mapping[str, Callable[[str], Any]], *,
    timeout: float | None, example: str,
) -> dict[str, Any]:
    """redis-py keyword arguments from the URL's credentials, its query and ``timeout``."""
    options: dict[str, Any] = {}
    if timeout is not None:
        options["socket_timeout"] = options["socket_connect_timeout"] = timeout
    if parsed.username is not None:
        options["username"] = parsed.username
    if parsed.password is not None:
        options["password"] = parsed.password
    for name, text in parsed.query.items():
        if name not in allowed:
            bad_url(url, f"unknown option {name!r}; known: {', '.join(sorted(allowed))}", example)
        try:
            options[name] = allowed[name](text)
        except ValueError as exc:
            bad_url(url, f"option {name!r} {exc}", example, cause=exc)
    return options


def redacted(url: object) -> str:
    """The URL with its passwords replaced by ``***``, fit for an error message."""
    if not isinstance(url, str) or "://" not in url:
        return repr(url)
    scheme, rest = url.split("://", 1)
    rest, mark, query = rest.partition("?")
    netloc, slash, path = rest.partition("/")
    userinfo, _, hosts = netloc.rpartition("@")
    user, colon, _password = userinfo.partition(":")
    if colon:
        netloc = f"{user}:***@{hosts}"
    if query:
        query = "&".join(
            f"{name}=***" if "password" in name.lower() else f"{name}{sep}{value}"
            for name, sep, value in (part.partition("=") for part in query.split("&"))
        )
    return repr(f"{scheme}://{netloc}{slash}{path}{mark}{query}")


def bad_url(
    url: object, reason: str, example: str, *, cause: Exception | None = None,
) -> NoReturn:
    """Raise ``ConfigError`` naming the URL (passwords hidden), why, and a good one."""
    msg = f"couldn't use storage URL {redacted(url)}: {reason}; expected e.g. {example!r}"
    raise ConfigError(msg) from cause


_REDIS_EXAMPLE = "redis://:password@127.0.0.1:6379/0?socket_keepalive=true"


def _redis_url_options(scheme: str) -> frozenset[str]:
    """The query options redis-py takes in a ``redis://`` URL: those it parses, and the
    connection's own arguments (it passes any other on to the connection, which then
    fails at every connect: the limiter would be off, not stopped at start-up)."""
    classes = [AbstractConnection, Connection, *([SSLConnection] if scheme == "rediss" else [])]
    names = {name for cls in classes for name in inspect.signature(cls.__init__).parameters}
    names -= {"self", "kwargs", "host", "port"}
    return frozenset(names | set(URL_QUERY_ARGUMENT_PARSERS) | {"max_connections", "timeout"})


def check_redis_url(url: str, scheme: str) -> None:
    """Refuse, naming it, what redis-py would take silently or fail on only later: a
    bad port, a database that is not a number (read as 0), an option it does not know."""
    parts = urlsplit(url)
    try:
        parts.port  # noqa: B018 - read for its check
    except ValueError as exc:
        bad_url(url, str(exc), _REDIS_EXAMPLE)
    database = parts.path.removeprefix("/")
    if database and not database.isdigit():
        bad_url(url, f"the database must be a number, got {database!r}", _REDIS_EXAMPLE)
    known = _redis_url_options(scheme)
    for name, _ in parse_qsl(parts.query, keep_blank_values=True):
        if name not in known:
            close = difflib.get_close_matches(name, known, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            bad_url(url, f"unknown option {name!r}{hint}", _REDIS_EXAMPLE)


def memory_options(url: str) -> dict[str, Any]:
    """``memory://`` or ``memory://?max_keys=N``: anything else in the URL is refused
    (it would be silently ignored)."""
    where, _, query = url.split("://", 1)[1].partition("?")
    if where not in ("", "/"):
        msg = f"memory storage URL {url!r} takes no host or path; expected 'memory://'"
        raise ConfigError(msg)
    options: dict[str, Any] = {}
    for name, value in parse_qsl(query, keep_blank_values=True):
        if name != "max_keys" or name in options:
            msg = (f"storage URL {url!r}: unknown or repeated option {name!r}; memory:// "
                   f"takes max_keys (memory://?max_keys=100000)")
            raise ConfigError(msg)
        try:
            options[name] = int(value)
        except ValueError:
            msg = f"storage URL {url!r}: max_keys must be a positive integer, got {value!r}"
            raise ConfigError(msg) from None
    return options

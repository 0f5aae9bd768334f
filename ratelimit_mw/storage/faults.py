"""Which storage errors are misconfiguration (fix the settings) and which are weather.

A wrong password, missing ACL permissions, a certificate that fails verification, a
database index the server refuses or a host name that does not resolve will not
mend by waiting: the server should not start on them. A refused connection or a
timeout is a runtime condition: the failure policy answers while it lasts.
"""

from __future__ import annotations

import socket
import ssl
from collections.abc import Iterator

from redis import exceptions as redis_errors

from ..errors import out_of_memory

__all__ = ["CONNECTION_LOST", "REDIS_FAILURES", "FailureCause", "cause", "failure_cause",
           "misconfiguration"]

# What a Redis call may raise when the storage fails; RedisClusterException (no
# topology, slot not covered) is not a RedisError.
REDIS_FAILURES = (redis_errors.RedisError, redis_errors.RedisClusterException, OSError,
                  TimeoutError)
# Failures after which the next decisions wait for a new connection (see connect_timeout).
CONNECTION_LOST = (redis_errors.ConnectionError, ConnectionError, redis_errors.ClusterDownError)

# Error replies (by their first word) that waiting will not change.
_FATAL_REPLIES = {
    "WRONGPASS": "authentication failed (wrong user name or password)",
    "NOAUTH": "authentication required (the URL gives no password)",
    "NOPERM": "the user lacks an ACL permission the library needs",
}
# getaddrinfo's "no such name" codes; EAI_AGAIN (a DNS server not answering) may mend.
_NO_SUCH_HOST = {socket.EAI_NONAME, getattr(socket, "EAI_NODATA", socket.EAI_NONAME)}


def _chain(exc: BaseException) -> Iterator[BaseException]:
    """``exc`` and the exceptions it was raised from, each once."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def misconfiguration(exc: BaseException) -> str | None:
    """Why ``exc`` means the storage is set up wrong, or None for a runtime failure."""
    for error in _chain(exc):
        text = str(error)
        first = text.split(" ", 1)[0]
        if first in _FATAL_REPLIES:
            return f"{_FATAL_REPLIES[first]}: {text}"
        if isinstance(error, redis_errors.AuthenticationError):
            return f"authentication failed: {text}"
        if "Protocol error: unauthenticated" in text:
            # Redis's reply, not NOAUTH, to a long first command (a script) before AUTH,
            # where the client's handshake checks nothing (RESP2, before redis-py 8).
            return f"{_FATAL_REPLIES['NOAUTH']}: {text}"
        if isinstance(error, redis_errors.NoPermissionError):
            return f"the user lacks an ACL permission the library needs: {text}"
        if isinstance(error, ssl.SSLCertVerificationError):
            return f"the TLS certificate failed verification: {error.verify_message or text}"
        if isinstance(error, socket.gaierror) and error.errno in _NO_SUCH_HOST:
            return f"the host name does not resolve: {text}"
        if "Cluster mode is not enabled" in text:
            return f"the server is not a Redis Cluster node: {text}"
        if isinstance(error, redis_errors.ResponseError) and (
                "DB index is out of range" in text or "invalid DB index" in text):
            return f"the server refuses the database index: {text}"
    return None


FailureCause = str
"""``timeout``, ``connection``, ``oom`` or ``error``: why a storage call failed."""


def failure_cause(exc: BaseException) -> FailureCause:
    """``timeout`` (no answer in time), ``connection`` (no connection: refused, lost,
    reset), ``oom`` (Redis is full and refuses writes: see ``eviction``) or ``error``
    (anything else: another error reply, a bug)."""
    if out_of_memory(exc):
        return "oom"
    for error in _chain(exc):
        if isinstance(error, TimeoutError | redis_errors.TimeoutError):
            return "timeout"
        if isinstance(error, redis_errors.ConnectionError | ConnectionError | OSError):
            return "connection"
    return "error"


def cause(exc: BaseException) -> str:
    """What went wrong, for a message (a timeout's own text is empty)."""
    return str(exc) or type(exc).__name__

"""Whether a request may be sent again: its body is in memory, and its method is safe to
replay or it carries an ``Idempotency-Key`` a server would honour."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .libraries import classes
from .policy import RetryPolicy

if TYPE_CHECKING:
    import httpx

_BYTE_STREAMS = classes("ByteStream")

__all__ = ["add_idempotency_key", "body_resendable", "safe_to_replay"]

def add_idempotency_key(request: httpx.Request, policy: RetryPolicy) -> None:
    """Give a method not safe to replay a fresh ``Idempotency-Key`` where it has none or a
    blank one, if the policy asks; called once, so every attempt carries the same key."""
    if (
        policy.add_idempotency_key
        and request.method.upper() not in policy.retry_methods
        and not request.headers.get("idempotency-key", "").strip()
    ):
        import uuid  # here, not at the top: uuid loads platform, a cost on every start-up

        request.headers["Idempotency-Key"] = str(uuid.uuid4())


def body_resendable(request: httpx.Request) -> bool:
    """Whether the body is held in memory, so another attempt can send it whole."""
    return isinstance(request.stream, _BYTE_STREAMS)


def safe_to_replay(request: httpx.Request, policy: RetryPolicy) -> bool:
    """Whether sending ``request`` twice cannot do its work twice: a method in
    ``retry_methods``, or a usable ``Idempotency-Key``."""
    return request.method.upper() in policy.retry_methods or _usable_key(request.headers)


def _usable_key(headers: httpx.Headers) -> bool:
    """Whether ``headers`` carry an ``Idempotency-Key`` a server would honour: not blank,
    at most 255 characters (an empty one gets a 400, or is ignored: replaying the
    request would risk doing it twice)."""
    key = headers.get("idempotency-key", "").strip()
    return 0 < len(key) <= 255

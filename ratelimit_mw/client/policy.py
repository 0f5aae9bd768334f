"""What is retried: the statuses, methods and transport errors worth another attempt, and
the settings, one frozen value overridable per request through ``extensions``."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from .hints import DEFAULT_HINTS, HintParser
from .libraries import classes

if TYPE_CHECKING:
    import httpx

__all__ = ["RETRY_ERRORS", "RETRY_METHODS", "RETRY_STATUSES", "UNSENT_ERRORS", "RetryPolicy"]

RETRY_STATUSES: frozenset[int] = frozenset({408, 429, 500, 502, 503, 504})
"""Statuses worth another attempt; every other status is returned as is."""

RETRY_METHODS: frozenset[str] = frozenset({"GET", "HEAD", "OPTIONS", "PUT", "DELETE"})
"""Methods safe to replay; others need an ``Idempotency-Key`` header."""

RETRY_ERRORS: tuple[type[httpx.TransportError], ...] = (
    *classes("TimeoutException"),
    *classes("NetworkError"),
    *classes("RemoteProtocolError"),
)
"""Connection and timeout errors worth another attempt (for a replayable request), of
httpx2 and httpx alike."""

UNSENT_ERRORS: tuple[type[httpx.TransportError], ...] = (
    *classes("ConnectError"),
    *classes("ConnectTimeout"),
    *classes("PoolTimeout"),
)
"""Errors raised before any byte of the request left: trying again replays nothing, so
any method is retried after them (if its body can be sent again)."""


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class RetryPolicy:
    """How a request is retried. Every field can be overridden for one request.

    >>> import httpx
    >>> once = {"retry": {"max_retries": 0}}
    >>> request = httpx.Request("GET", "https://example.org", extensions=once)
    >>> RetryPolicy().for_request(request).max_retries
    0
    """

    max_retries: int = 3
    """Retries after the first attempt; 0 disables retrying."""
    max_time: float | None = 60.0
    """Total seconds from the first attempt; a wait that would end later (the limiter's
    queue included) is not started."""
    backoff_base: float = 0.5
    """Upper bound of the first jittered wait, doubled on each retry."""
    backoff_cap: float = 30.0
    """Largest jittered wait; server hints are never capped."""
    retry_statuses: frozenset[int] = RETRY_STATUSES
    retry_methods: frozenset[str] = RETRY_METHODS
    add_idempotency_key: bool = False
    """Give POST and PATCH (any method not in ``retry_methods``) an ``Idempotency-Key``."""
    buffer_body: bool = False
    """Read a streamed request body into memory first so it can be replayed."""
    raise_on_give_up: bool = False
    """Raise :class:`RetriesExhausted` instead of returning the last retryable response."""
    hints: tuple[HintParser, ...] = DEFAULT_HINTS
    """Parsers of server wait hints, tried in order; the first answer wins."""

    def __post_init__(self) -> None:
        """Check every field once, at construction (a wrong type would otherwise turn
        retrying off without a word, or fail at the first retry)."""
        if not _is_int(self.max_retries) or self.max_retries < 0:
            msg = f"max_retries must be an integer >= 0, got {self.max_retries!r}"
            raise ValueError(msg)
        if self.max_time is not None and not (
                _is_number(self.max_time) and 0 <= self.max_time < math.inf):
            msg = f"max_time must be a finite number >= 0 or None, got {self.max_time!r}"
            raise ValueError(msg)
        for name in ("backoff_base", "backoff_cap"):
            value = getattr(self, name)
            if not (_is_number(value) and 0 <= value < math.inf):
                msg = f"{name} must be a finite number >= 0, got {value!r}"
                raise ValueError(msg)
        statuses = _collection_items("retry_statuses", self.retry_statuses, "{429, 503}")
        for status in statuses:
            if not _is_int(status) or not 100 <= status <= 599:
                msg = f"retry_statuses must hold HTTP status codes (ints), got {status!r}"
                raise ValueError(msg)
        methods = _collection_items("retry_methods", self.retry_methods, "{'GET', 'PUT'}")
        for method in methods:
            if not isinstance(method, str) or not method.strip():
                msg = f"retry_methods must hold HTTP method names, got {method!r}"
                raise ValueError(msg)
        hints = _collection_items("hints", self.hints, "DEFAULT_HINTS")
        for hint in hints:
            if not callable(hint):
                msg = f"hints must hold parsers (callables of a response), got {hint!r}"
                raise ValueError(msg)
        object.__setattr__(self, "retry_statuses", frozenset(statuses))
        object.__setattr__(self, "retry_methods", frozenset(m.strip().upper() for m in methods))
        object.__setattr__(self, "hints", tuple(hints))

    def replace(self, overrides: Mapping[str, Any]) -> RetryPolicy:
        """Return a copy with some fields changed; unknown names raise ``TypeError``."""
        unknown = sorted(set(overrides) - {f.name for f in dataclasses.fields(self)})
        if unknown:
            known = ", ".join(f.name for f in dataclasses.fields(self))
            msg = f"unknown retry setting(s) {', '.join(unknown)}; expected some of: {known}"
            raise TypeError(msg)
        return dataclasses.replace(self, **overrides)

    def for_request(self, request: httpx.Request) -> RetryPolicy:
        """Apply ``request.extensions["retry"]``: a :class:`RetryPolicy` or a dict of overrides."""
        override = request.extensions.get("retry")
        if override is None:
            return self
        if isinstance(override, RetryPolicy):
            return override
        if isinstance(override, Mapping):
            return self.replace(override)
        msg = (
            f"extensions['retry'] must be a RetryPolicy or a dict of overrides, "
            f"got {type(override).__name__}"
        )
        raise TypeError(msg)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _collection_items(name: str, value: object, example: str) -> list[Any]:
    """The items of a collection setting; a lone string (or a non-iterable) is refused,
    as iterating ``"503"`` would give ``{"5", "0", "3"}``."""
    if isinstance(value, str | bytes) or not hasattr(value, "__iter__"):
        msg = f"{name} must be a collection such as {example}, got {value!r}"
        raise ValueError(msg)
    return list(value)

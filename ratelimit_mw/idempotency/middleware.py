"""IdempotencyMiddleware: a retried POST gets the first answer again instead of a second run."""

from __future__ import annotations

import asyncio
import dataclasses
import fnmatch
import inspect
import logging
import re
from collections.abc import Awaitable, Callable, Iterable

import anyio
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ..checks import header_name, positive_seconds
from ..client_ip import ClientIP
from ..errors import ConfigError, StorageError
from ..identity import credentials
from ..limiter import limiter_of
from ..metrics import Metrics
from ..outages import OutageLog
from ..responses import error_response
from .fingerprint import fingerprint, record_key
from .header import InvalidKeyError, parse_idempotency_key
from .memory import MemoryIdempotencyStore
from .messages import BodyTooLargeError, adding_header, read_body, replay, replaying
from .store import IdempotencyStore, StoredResponse

__all__ = ["IdempotencyMiddleware", "IdentityFunc"]

IdentityFunc = Callable[[Scope], "str | Awaitable[str | None] | None"]

_log = logging.getLogger("ratelimit_mw.idempotency")
_MiB = 1024 * 1024
# "Try again later" answers (timeout, too early, too many requests) are never kept:
# kept, they would answer the retry they invite for the whole ttl.
_RETRY_LATER = frozenset({408, 425, 429})
# Seconds between attempts to store a finished response: the work is done, and a store
# that hiccups must not make a retry do it again.
_STORE_RETRY_DELAYS = (0.05, 0.25)


def _answer(status: int, error: str, message: str, **headers: str) -> JSONResponse:
    """One of the middleware's own answers; they are never stored."""
    return error_response(status, error, message, headers=headers)


def _size(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        msg = f"{name} must be a whole number of bytes >= 0, got {value!r}"
        raise ConfigError(msg)
    return value


class IdempotencyMiddleware:
    """Run each POST/PATCH with an ``Idempotency-Key`` once; replay its response after.

    The key is scoped to the caller, and paired with a SHA-256 fingerprint of
    method, path, query and body. By default the caller is who the rate limiter
    resolved (when ``RateLimitMiddleware`` runs in front of this one) sending the
    same credentials: a digest of every ``Authorization`` and ``api_key_header``
    value, or of the ``Cookie`` header when it has neither; a request with no
    credential is known by its client IP (behind ``trusted_proxies``). Two
    requests that differ in any credential never share a record. ``identity(scope)``
    replaces all of this (``None`` turns idempotency off for that request). Then,
    for the same caller and key:

    - first request: it runs, and its complete response (status < 500, one body
      chunk of at most ``max_response_size`` bytes) is kept for ``ttl`` seconds;
    - later, same request: that response again, with ``X-Idempotent-Replayed: true``;
    - every answer to a keyed request (the first, a replay, a 409 or 422) carries
      ``Idempotency-Key`` back, as the client sent it;
    - while the first still runs: 409, the handler is not run. The lock is a lease
      of ``lock_ttl`` seconds, renewed every third of it while the handler runs, so
      a crashed worker frees its keys by itself within ``lock_ttl``;
    - a different request (fingerprint): 422;
    - a handler that raises, answers 5xx, 408, 425 or 429 (which ask for a retry)
      or streams (more than one body chunk, or too big a body) stores nothing and
      frees the key, so the next attempt runs. A request that ends without a full
      response (the client went away and the handler stopped) frees the key too; a
      handler that finishes anyway has its response kept, because the work was done
      and must not be repeated. For that reason a response the store fails to keep
      (after two quick retries) leaves the key locked, logged as an error: retries
      get 409 until the lease runs out, ``lock_ttl`` after the handler returned.

    A missing key where ``required`` says one is needed, an empty one, one over
    255 characters or not printable ASCII: 400. ``required`` holds path patterns
    (``fnmatch``: ``"/payments"``, ``"/orders/*"``), optionally with a method
    (``"POST /orders/*"``). GET, HEAD and other methods not in ``methods`` pass
    through untouched, key or not. The middleware's own 400/409/413/422/503
    answers are never stored.

    The body is read whole to fingerprint it (then handed to the app
    unchanged); over ``max_request_size`` bytes the answer is 413 and the
    handler is not run: a keyed request is idempotent or refused, never
    silently not idempotent. When the store fails the answer is 503, with the
    store's ``retry_after`` (its breaker's cooldown), unless ``fail_open=True``
    runs the request without idempotency. ``metrics`` (``ratelimit_mw.metrics``) counts
    replays, 409s, 422s and store failures.

    >>> from starlette.applications import Starlette
    >>> from starlette.middleware import Middleware
    >>> app = Starlette(middleware=[Middleware(IdempotencyMiddleware, required=["/payments"])])
    """

    __slots__ = (
        "_api_key_header",
        "_client_ip",
        "_identity",
        "_metrics",
        "_outages",
        "_required",
        "app",
        "fail_open",
        "lock_ttl",
        "max_request_size",
        "max_response_size",
        "methods",
        "store",
        "ttl",
    )

    def __init__(
        self,
        app: ASGIApp,
        *,
        store: IdempotencyStore | None = None,
        ttl: float = 24 * 60 * 60,
        lock_ttl: float = 60.0,
        methods: Iterable[str] = ("POST", "PATCH"),
        required: Iterable[str] = (),
        identity: IdentityFunc | None = None,
        api_key_header: str = "x-api-key",
        trusted_proxies: Iterable[str] = (),
        max_request_size: int = _MiB,
        max_response_size: int = _MiB,
        fail_open: bool = False,
        metrics: Metrics | None = None,
    ) -> None:
        if store is not None and not isinstance(store, IdempotencyStore):
            msg = f"store must be an IdempotencyStore, got {store!r}"
            raise ConfigError(msg)
        if identity is not None and not callable(identity):
            msg = f"identity must be a callable taking the ASGI scope, got {identity!r}"
            raise ConfigError(msg)
        if isinstance(methods, str):
            methods = methods.split(",")
        self.methods = frozenset(m.strip().upper() for m in methods)
        if not self.methods or not all(m.isalpha() for m in self.methods):
            msg = f"methods must be HTTP method names such as 'POST', got {sorted(self.methods)}"
            raise ConfigError(msg)
        if self.methods & {"GET", "HEAD"}:
            msg = "GET and HEAD are safe already; methods should be the unsafe ones, e.g. POST"
            raise ConfigError(msg)
        self.app = app
        self.store = store if store is not None else MemoryIdempotencyStore()
        self.ttl = positive_seconds("ttl", ttl)
        self.lock_ttl = positive_seconds("lock_ttl", lock_ttl)
        self.max_request_size = _size("max_request_size", max_request_size)
        self.max_response_size = _size("max_response_size", max_response_size)
        self.fail_open = fail_open
        self._identity = identity
        # Replays, 409s, 422s and store failures are counted (the default counts nothing).
        self._metrics = metrics if metrics is not None else Metrics()
        self._api_key_header = header_name(api_key_header, "api_key_header").encode("latin-1")
        self._client_ip = ClientIP(trusted_proxies)
        self._required = [self._required_rule(rule) for rule in required]
        # A failing store is logged once an outage (claims, renewals, releases counted).
        self._outages = OutageLog(
            "idempotency store", "idempotency_store_failed",
            "requests with a key run without it" if fail_open else
            "requests with a key answer 503", logger=_log)

    def _required_rule(self, rule: str) -> tuple[frozenset[str], re.Pattern[str]]:
        """``"[METHOD ]pattern"`` as the methods it covers and a compiled path pattern."""
        method, _, pattern = rule.strip().rpartition(" ")
        if not pattern.startswith("/"):
            msg = f"required rule {rule!r} must be a path pattern such as '/orders/*'"
            raise ConfigError(msg)
        methods = frozenset({method.strip().upper()}) if method else self.methods
        if not methods <= self.methods:
            msg = f"required rule {rule!r} names a method not in methods={sorted(self.methods)}"
            raise ConfigError(msg)
        return methods, re.compile(fnmatch.translate(pattern))

    def requires_key(self, method: str, path: str) -> bool:
        """True when a ``method`` request to ``path`` must carry an Idempotency-Key."""
        return any(method in methods and pattern.match(path) for methods, pattern in self._required)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] not in self.methods:
            await self.app(scope, receive, send)
            return

        method, path = scope["method"], scope["path"]
        values = [value.decode("latin-1") for name, value in scope["headers"]
                  if name == b"idempotency-key"]
        if not values:
            if self.requires_key(method, path):
                message = f"{method} {path} requires an Idempotency-Key header (e.g. a UUID)"
                await _answer(400, "idempotency_key_missing", message)(scope, receive, send)
                return
            await self.app(scope, receive, send)
            return
        try:
            key = parse_idempotency_key(values)
        except InvalidKeyError as exc:
            await _answer(400, "idempotency_key_invalid", str(exc))(scope, receive, send)
            return

        owner = await self._owner(scope)
        if owner is None:
            await self.app(scope, receive, send)
            return
        # Every answer to a keyed request carries the key back, as the client sent it.
        echo = (b"idempotency-key", values[0].strip(" \t").encode("latin-1"))
        await self._keyed(scope, receive, adding_header(send, echo), record_key(owner, key))

    async def _owner(self, scope: Scope) -> str | None:
        """Whose records this request may share (None: no idempotency for it)."""
        if self._identity is not None:
            owner = self._identity(scope)
            if inspect.isawaitable(owner):
                owner = await owner
            return None if owner is None else str(owner)
        limiter = limiter_of(scope)
        if limiter is None:
            return credentials(scope, self._api_key_header) or self._client_ip(scope)
        identity = limiter.identity
        sent = credentials(scope, identity.api_key_header) or identity.client_ip(scope)
        caller = await identity.key_of(scope)
        return sent if caller is None else f"{caller} {sent}"

    async def _keyed(self, scope: Scope, receive: Receive, send: Send, record: str) -> None:
        """Handle a request that carries a valid key, kept under ``record``."""
        try:
            body = await read_body(scope, receive, self.max_request_size)
        except BodyTooLargeError:
            message = (
                f"a request with an Idempotency-Key may carry at most "
                f"{self.max_request_size} body bytes"
            )
            await _answer(413, "request_too_large", message)(scope, receive, send)
            return
        if body is None:
            return  # the client left before sending its body: nothing was claimed
        receive = replaying(body, receive)

        fp = fingerprint(scope["method"], scope["path"], scope.get("query_string", b""), body)
        try:
            claim = await self.store.claim(record, fp, lock_ttl=self.lock_ttl)
        except StorageError as exc:
            self._metrics.idempotency("store_failure")
            self._outages.failed(exc)
            if self.fail_open:
                await self.app(scope, receive, send)
                return
            message = "the idempotency store is unavailable; retry shortly with the same key"
            wait = {"Retry-After": str(self.store.retry_after)}
            response = _answer(503, "idempotency_unavailable", message, **wait)
            await response(scope, receive, send)
            return
        self._outages.succeeded()

        if claim.outcome == "mismatch":
            self._metrics.idempotency("mismatch")
            message = "this Idempotency-Key was already used for a different request"
            await _answer(422, "idempotency_key_reused", message)(scope, receive, send)
        elif claim.outcome == "in_flight":
            self._metrics.idempotency("conflict")
            message = "a request with this Idempotency-Key is still being processed"
            response = _answer(409, "idempotency_key_in_use", message, **{"Retry-After": "1"})
            await response(scope, receive, send)
        elif claim.response is not None:
            self._metrics.idempotency("replay")
            await replay(claim.response, send)
        else:
            await self._run(scope, receive, send, record, fp, claim.token)

    async def _run(
        self, scope: Scope, receive: Receive, send: Send, record: str, fp: str, token: str
    ) -> None:
        """Run the app on a claimed key; keep its response if it is storable, else free the key."""
        start: StoredResponse | None = None
        storable = True
        finished = False  # stored, or the store tried: nothing left to release

        async def send_wrapper(message: Message) -> None:
            nonlocal start, storable, finished
            kind = message["type"]
            if kind == "http.response.start":
                status = message["status"]
                # Copied now: an outer middleware may change the message once it is sent.
                headers = tuple((bytes(k), bytes(v)) for k, v in message.get("headers", ()))
                start = StoredResponse(status, headers, b"")
                storable = (status < 500 and status not in _RETRY_LATER
                            and not message.get("trailers", False))
            elif kind == "http.response.body" and storable and start is not None:
                body = message.get("body", b"")
                storable = False  # only the first chunk, and only if it is the last one
                if not message.get("more_body", False) and len(body) <= self.max_response_size:
                    # Stored before it is sent, so a client that already has the answer and
                    # sends again is replayed, never told 409.
                    await self._complete(record, token, fp, dataclasses.replace(start, body=body))
                    finished = True
            else:
                storable = False  # a streamed body, trailers, or a server extension
            await send(message)

        renewing = asyncio.ensure_future(self._renew(record, token))
        try:
            await self.app(scope, receive, send_wrapper)
        finally:
            renewing.cancel()
            if not finished:
                # Shielded: the app may have been cancelled (client gone), and the key
                # must be freed all the same.
                with anyio.CancelScope(shield=True):
                    await self._release(record, token)

    async def _renew(self, record: str, token: str) -> None:
        """Renew the lease every third of ``lock_ttl`` until it is no longer ours to renew."""
        while True:
            await asyncio.sleep(self.lock_ttl / 3)
            try:
                if not await self.store.renew(record, token, lock_ttl=self.lock_ttl):
                    return  # stored, released, or lost to a retry after it ran out
            except StorageError as exc:
                self._outages.failed(exc)  # tried again in a third of lock_ttl

    async def _complete(self, record: str, token: str, fp: str, response: StoredResponse) -> None:
        """Store the response, retrying briefly; if it can't be, the lease stays (logged)."""
        with anyio.CancelScope(shield=True):
            for delay in (0.0, *_STORE_RETRY_DELAYS):
                await asyncio.sleep(delay)
                try:
                    stored = await self.store.complete(record, token, fp, response, ttl=self.ttl)
                except StorageError as exc:
                    error = exc
                    continue
                if not stored:
                    _log.warning("idempotency lease ran out before the response was ready; "
                                 "not stored")
                return
        self._metrics.idempotency("store_failure")
        _log.error("could not store an idempotent response after %d attempts; its key stays "
                   "locked until the lease runs out (lock_ttl=%g s), so a retry gets 409 "
                   "instead of running the handler again: %s",
                   1 + len(_STORE_RETRY_DELAYS), self.lock_ttl, error)

    async def _release(self, record: str, token: str) -> None:
        try:
            await self.store.release(record, token)
        except StorageError as exc:
            # The lease expires by itself after lock_ttl.
            self._metrics.idempotency("store_failure")
            self._outages.failed(exc)

"""The retrying transport: wraps any httpx2 or httpx transport, sync or async."""

from __future__ import annotations

import random as _random
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from ..breaker import CircuitBreaker
from . import aio
from .attempts import Attempts, Retrying
from .bucket import TokenBucket
from .budget import RetryBudget
from .circuit import acquire_permit, refuse_if_open
from .libraries import HTTP_ERRORS, AsyncBaseTransport, BaseTransport, classes, library_of
from .metrics import ClientMetrics
from .policy import RetryPolicy
from .testing import is_testing

if TYPE_CHECKING:
    import httpx

__all__ = ["RetryTransport"]

_SYNC_TRANSPORTS = classes("BaseTransport")
_ASYNC_TRANSPORTS = classes("AsyncBaseTransport")


class RetryTransport(BaseTransport, AsyncBaseTransport):
    """An httpx2 or httpx transport that retries rate-limited and failed attempts, then
    returns.

    It wraps ``transport`` (by default ``HTTPTransport()`` for a ``Client`` and
    ``AsyncHTTPTransport()`` for an ``AsyncClient``, of the client's own library),
    retries 408, 429, 500, 502, 503, 504 and connection or timeout errors,
    waits what the server asks (``Retry-After``, then quota reset headers) or
    else a jittered exponential backoff, and stops at ``max_retries`` or as
    soon as the next wait (the ``limiter``'s included) would overrun ``max_time``
    (a wait of over a day is never started). Only methods safe to
    replay are retried; POST and PATCH need an ``Idempotency-Key`` header (not blank, at
    most 255 characters; ``add_idempotency_key`` sets one where none or a blank is), but for
    ``UNSENT_ERRORS`` (nothing was sent: nothing would be replayed).

    Settings come from ``policy`` and can be overridden per request with
    ``extensions={"retry": {...}}``. ``retry_budget`` and ``limiter`` are
    shared across calls; ``clock``, ``wall_clock``, the sleeps and ``random``
    are injectable for tests.

    >>> import asyncio, httpx  # or httpx2, the same
    >>> replies = iter([httpx.Response(429, headers={"Retry-After": "0"}), httpx.Response(200)])
    >>> api = httpx.MockTransport(lambda request: next(replies))  # leave out to use the network
    >>> async def main() -> int:
    ...     async with httpx.AsyncClient(transport=RetryTransport(api)) as client:
    ...         response = await client.get("https://api.example.org/items")
    ...     return response.status_code
    >>> asyncio.run(main())
    200

    One request with other settings:
    ``client.post(url, json=order, extensions={"retry": {"add_idempotency_key": True}})``.

    With a ``limiter``, every attempt waits for a token first; with ``max_time`` too,
    for no longer than the budget left (else the last response is handed back, or
    before the first attempt `LimiterTimeout` is raised). With a ``breaker``, every
    attempt asks it just before sending (so time queued in the limiter is not taken
    for a slow call): while it refuses, the request fails fast with
    `CircuitOpenTransportError` and nothing is sent.
    5xx responses and ``RETRY_ERRORS`` count as failures, other responses as
    successes, other exceptions as the breaker's ``failure_exceptions`` say.
    A retry that the breaker would still refuse after the wait is not waited for.

    ``metrics`` (``ratelimit_mw.metrics``) counts attempts, retries by cause, time slept
    and give-ups by reason, labelled by host, and watches the ``breaker``.
    """

    def __init__(
        self,
        transport: httpx.BaseTransport | httpx.AsyncBaseTransport | None = None,
        *,
        policy: RetryPolicy | None = None,
        retry_budget: RetryBudget | None = None,
        limiter: TokenBucket | None = None,
        breaker: CircuitBreaker | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        sleep: Callable[[float], None] = time.sleep,
        async_sleep: Callable[[float], Awaitable[None]] = aio.sleep,
        random: Callable[[], float] = _random.random,
        metrics: ClientMetrics | None = None,
    ) -> None:
        self.policy = policy if policy is not None else RetryPolicy()
        self.retry_budget = retry_budget
        if limiter is not None and limiter.capacity < 1:
            msg = (f"the limiter's capacity must be at least 1 (each attempt takes a token), "
                   f"got {limiter.capacity:g}")
            raise ValueError(msg)
        self.limiter = limiter
        self.breaker = breaker
        self._given_transport = transport
        self._sync_inner: httpx.BaseTransport | None = (
            transport if isinstance(transport, _SYNC_TRANSPORTS) else None)
        self._async_inner: httpx.AsyncBaseTransport | None = (
            transport if isinstance(transport, _ASYNC_TRANSPORTS) else None)
        self._clock = clock
        self._wall_clock = wall_clock
        self._sleep = sleep
        self._async_sleep = async_sleep
        self._random = random
        self.metrics = metrics
        if metrics is not None and breaker is not None:
            metrics.watch(breaker)

    def __repr__(self) -> str:
        return f"RetryTransport({self._given_transport!r}, policy={self.policy!r})"

    def _retrying(self) -> Retrying:
        return Retrying(self.policy, self.retry_budget, self.limiter, self.breaker,
                        self._clock, self._wall_clock, self._random, self.metrics)

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        """Send ``request`` through the wrapped sync transport, retrying as the policy says."""
        inner = self._sync_transport(request)
        attempts = Attempts(self._retrying(), request)
        if attempts.policy.buffer_body:
            request.read()
        attempts.decide_replayable()
        while True:
            refuse_if_open(self.breaker, request)
            if self.limiter is not None and not self.limiter.acquire_sync(
                    timeout=attempts.time_left()):
                return attempts.no_token_in_time()
            permit = acquire_permit(self.breaker, request)
            attempts.sending()
            try:
                response = inner.handle_request(request)
            except BaseException as exc:
                if (wait := attempts.wait_after_error(permit, exc)) is None:
                    raise
            else:
                if (wait := attempts.wait_after_response(permit, response)) is None:
                    if attempts.should_raise(response):
                        response.close()
                        raise attempts.exhausted_error(response) from None
                    return response
                if attempts.keeps_last_outcome:
                    try:
                        response.read()
                    except HTTP_ERRORS as exc:
                        attempts.last_outcome = exc
                    else:
                        attempts.last_outcome = response
                response.close()
                refuse_if_open(self.breaker, request, longer_than=wait)
            if is_testing():
                attempts.skipped_wait += wait
            else:
                self._sleep(wait)

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        """Send ``request`` through the wrapped async transport, retrying as the policy says."""
        inner = self._async_transport(request)
        attempts = Attempts(self._retrying(), request)
        if attempts.policy.buffer_body:
            await request.aread()
        attempts.decide_replayable()
        while True:
            refuse_if_open(self.breaker, request)
            if self.limiter is not None and not await self.limiter.acquire(
                    timeout=attempts.time_left()):
                return attempts.no_token_in_time()
            permit = acquire_permit(self.breaker, request)
            attempts.sending()
            try:
                response = await inner.handle_async_request(request)
            except BaseException as exc:
                if (wait := attempts.wait_after_error(permit, exc)) is None:
                    raise
            else:
                if (wait := attempts.wait_after_response(permit, response)) is None:
                    if attempts.should_raise(response):
                        await response.aclose()
                        raise attempts.exhausted_error(response) from None
                    return response
                if attempts.keeps_last_outcome:
                    try:
                        await response.aread()
                    except HTTP_ERRORS as exc:
                        attempts.last_outcome = exc
                    else:
                        attempts.last_outcome = response
                await response.aclose()
                refuse_if_open(self.breaker, request, longer_than=wait)
            if is_testing():
                attempts.skipped_wait += wait
            else:
                await self._async_sleep(wait)

    def close(self) -> None:
        """Close the wrapped sync transport."""
        if self._sync_inner is not None:
            self._sync_inner.close()

    async def aclose(self) -> None:
        """Close the wrapped async transport."""
        if self._async_inner is not None:
            await self._async_inner.aclose()

    def _sync_transport(self, request: httpx.Request) -> httpx.BaseTransport:
        """Return the wrapped sync transport, creating the default one of ``request``'s
        library on first use."""
        if self._sync_inner is None:
            self._refuse_wrong_kind("a sync", "Client")
            self._sync_inner = library_of(request).HTTPTransport()
        return self._sync_inner

    def _async_transport(self, request: httpx.Request) -> httpx.AsyncBaseTransport:
        """Return the wrapped async transport, creating the default one of ``request``'s
        library on first use."""
        if self._async_inner is None:
            self._refuse_wrong_kind("an async", "AsyncClient")
            self._async_inner = library_of(request).AsyncHTTPTransport()
        return self._async_inner

    def _refuse_wrong_kind(self, kind: str, client: str) -> None:
        """Fail clearly when the given transport cannot serve this kind of client."""
        if self._given_transport is not None:
            msg = (
                f"{type(self._given_transport).__name__} is not {kind} transport; "
                f"wrap {kind} transport to use RetryTransport with {client}"
            )
            raise TypeError(msg)

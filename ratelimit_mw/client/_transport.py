"""The retrying transport: wraps any httpx transport, sync or async."""

from __future__ import annotations

import asyncio
import logging
import math
import random as _random
import time
import uuid
from collections.abc import Awaitable, Callable

import httpx

from ..breaker import CircuitBreaker, CircuitOpenError, CircuitState, Permit
from ._backoff import full_jitter
from ._bucket import LONGEST_PAUSE, TokenBucket
from ._budget import RetryBudget
from ._errors import GiveUpReason, RetriesExhausted
from ._hints import read_quota, retry_after_hint
from ._policy import RetryPolicy
from ._testing import is_testing

__all__ = ["RETRY_ERRORS", "UNSENT_ERRORS", "CircuitOpenTransportError", "LimiterTimeout",
           "RetryTransport"]

logger = logging.getLogger("ratelimit_mw.client")

RETRY_ERRORS: tuple[type[httpx.TransportError], ...] = (
    httpx.TimeoutException,
    httpx.NetworkError,
    httpx.RemoteProtocolError,
)
"""Connection and timeout errors worth another attempt (for a replayable request)."""

UNSENT_ERRORS: tuple[type[httpx.TransportError], ...] = (
    httpx.ConnectError,
    httpx.ConnectTimeout,
    httpx.PoolTimeout,
)
"""Errors raised before any byte of the request left: trying again replays nothing, so
any method is retried after them (if its body can be sent again)."""

LONGEST_WAIT = LONGEST_PAUSE
"""The longest wait ever started, a day, even without ``max_time``: a server that asks
for more is answered by giving up (reason ``max_time``), returning its response."""


class LimiterTimeout(httpx.TimeoutException):
    """The transport's limiter had no token for the first attempt within ``max_time``:
    nothing was sent. (For a retry, the last response is handed back instead.)"""


class CircuitOpenTransportError(httpx.TransportError, CircuitOpenError):
    """The transport's circuit breaker refused the attempt: no request was sent.

    Both an ``httpx.TransportError`` (so ``except httpx.HTTPError`` sees it) and
    the breaker's `CircuitOpenError`; ``remaining`` is the cooldown left, in
    seconds (0.0 when the breaker is half-open with every trial slot taken).
    """

    def __init__(
        self,
        remaining: float,
        name: str = "circuit",
        state: CircuitState = CircuitState.OPEN,
        *,
        request: httpx.Request | None = None,
    ) -> None:
        # httpx's __init__ chain would hand the message to CircuitOpenError as
        # ``remaining``: build the breaker error, then set what httpx expects.
        CircuitOpenError.__init__(self, remaining, name, state)
        self._request = request


class RetryTransport(httpx.BaseTransport, httpx.AsyncBaseTransport):
    """An httpx transport that retries rate-limited and failed attempts, then returns.

    It wraps ``transport`` (by default ``httpx.HTTPTransport()`` for a
    ``Client`` and ``httpx.AsyncHTTPTransport()`` for an ``AsyncClient``),
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

    >>> import asyncio
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
        async_sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        random: Callable[[], float] = _random.random,
    ) -> None:
        self.policy = policy if policy is not None else RetryPolicy()
        self.retry_budget = retry_budget
        if limiter is not None and limiter.capacity < 1:
            msg = (f"the limiter's capacity must be at least 1 (each attempt takes a token), "
                   f"got {limiter.capacity:g}")
            raise ValueError(msg)
        self.limiter = limiter
        self.breaker = breaker
        self._given = transport
        self._sync: httpx.BaseTransport | None = None
        self._async: httpx.AsyncBaseTransport | None = None
        if transport is not None:
            self._sync = transport if isinstance(transport, httpx.BaseTransport) else None
            self._async = transport if isinstance(transport, httpx.AsyncBaseTransport) else None
        self._clock = clock
        self._wall_clock = wall_clock
        self._sleep = sleep
        self._async_sleep = async_sleep
        self._random = random

    def __repr__(self) -> str:
        return f"RetryTransport({self._given!r}, policy={self.policy!r})"

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        """Send ``request`` through the wrapped sync transport, retrying as the policy says."""
        inner = self._sync_transport()
        state = _Attempts(self, request)
        if state.policy.buffer_body:
            request.read()
        state.check_replayable()
        while True:
            state.check_open()
            if self.limiter is not None and not self.limiter.acquire_sync(
                    timeout=state.time_left()):
                return state.out_of_time()
            permit = state.permit()
            try:
                response = inner.handle_request(request)
            except RETRY_ERRORS as exc:
                state.record(permit, exc)
                if (wait := state.after_error(exc)) is None:
                    raise
                state.check_breaker(wait, exc)
                state.last = exc
            except BaseException as exc:
                state.record(permit, exc)
                raise
            else:
                state.record(permit, response)
                if (wait := state.after_response(response)) is None:
                    if state.should_raise(response):
                        response.close()
                        raise state.exhausted(response) from None
                    return response
                if state.keeps_last:
                    try:
                        response.read()
                    except httpx.HTTPError as exc:
                        state.last = exc
                    else:
                        state.last = response
                response.close()
                state.check_breaker(wait, None)
            if is_testing():
                state.skipped += wait
            else:
                self._sleep(wait)

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        """Send ``request`` through the wrapped async transport, retrying as the policy says."""
        inner = self._async_transport()
        state = _Attempts(self, request)
        if state.policy.buffer_body:
            await request.aread()
        state.check_replayable()
        while True:
            state.check_open()
            if self.limiter is not None and not await self.limiter.acquire(
                    timeout=state.time_left()):
                return state.out_of_time()
            permit = state.permit()
            try:
                response = await inner.handle_async_request(request)
            except RETRY_ERRORS as exc:
                state.record(permit, exc)
                if (wait := state.after_error(exc)) is None:
                    raise
                state.check_breaker(wait, exc)
                state.last = exc
            except BaseException as exc:
                state.record(permit, exc)
                raise
            else:
                state.record(permit, response)
                if (wait := state.after_response(response)) is None:
                    if state.should_raise(response):
                        await response.aclose()
                        raise state.exhausted(response) from None
                    return response
                if state.keeps_last:
                    try:
                        await response.aread()
                    except httpx.HTTPError as exc:
                        state.last = exc
                    else:
                        state.last = response
                await response.aclose()
                state.check_breaker(wait, None)
            if is_testing():
                state.skipped += wait
            else:
                await self._async_sleep(wait)

    def close(self) -> None:
        """Close the wrapped sync transport."""
        if self._sync is not None:
            self._sync.close()

    async def aclose(self) -> None:
        """Close the wrapped async transport."""
        if self._async is not None:
            await self._async.aclose()

    def _sync_transport(self) -> httpx.BaseTransport:
        """Return the wrapped sync transport, creating the default one on first use."""
        if self._sync is None:
            self._refuse_given("a sync", "httpx.Client")
            self._sync = httpx.HTTPTransport()
        return self._sync

    def _async_transport(self) -> httpx.AsyncBaseTransport:
        """Return the wrapped async transport, creating the default one on first use."""
        if self._async is None:
            self._refuse_given("an async", "httpx.AsyncClient")
            self._async = httpx.AsyncHTTPTransport()
        return self._async

    def _refuse_given(self, kind: str, client: str) -> None:
        """Fail clearly when the given transport cannot serve this kind of client."""
        if self._given is not None:
            msg = (
                f"{type(self._given).__name__} is not {kind} transport; "
                f"wrap {kind} transport to use RetryTransport with {client}"
            )
            raise TypeError(msg)


class _Attempts:
    """One request's retry bookkeeping, shared by the sync and async loops."""

    __slots__ = ("_reason", "_start", "_transport", "attempt", "keeps_last", "last", "policy",
                 "replayable", "request", "resendable", "skipped")

    def __init__(self, transport: RetryTransport, request: httpx.Request) -> None:
        self._transport = transport
        self.request = request
        self.policy = transport.policy.for_request(request)
        self.attempt = 0
        self.replayable = True
        self.resendable = True
        self._reason: GiveUpReason = "max_retries"
        self._start = transport._clock()
        self.skipped = 0.0
        """Seconds of waiting skipped in testing mode, counted as if waited."""
        self.last: httpx.Response | httpx.HTTPError | None = None
        """The last attempt's outcome, handed back if the limiter has no token in time."""
        # Only with a limiter and a time budget can a retry fail after its wait: then the
        # response is read before it is closed, so that it can still be handed back.
        self.keeps_last = transport.limiter is not None and self.policy.max_time is not None
        method = request.method.upper()
        if (
            self.policy.add_idempotency_key
            and method not in self.policy.retry_methods
            and not request.headers.get("idempotency-key", "").strip()
        ):
            # Set once, so every attempt carries the same key.
            request.headers["Idempotency-Key"] = str(uuid.uuid4())

    def check_open(self) -> None:
        """Fail fast while the breaker, if any, is open (before queueing in the limiter)."""
        breaker = self._transport.breaker
        if breaker is not None and breaker.remaining_cooldown > 0:
            raise self._refused(breaker) from None

    def time_left(self) -> float | None:
        """Seconds left of ``max_time`` (None: no budget)."""
        if self.policy.max_time is None:
            return None
        return self.policy.max_time - self._elapsed()

    def _elapsed(self) -> float:
        return self._transport._clock() - self._start + self.skipped

    def out_of_time(self) -> httpx.Response:
        """Give up because the limiter had no token within ``max_time``: hand back the
        last response (or raise it as `RetriesExhausted`, or raise the last error);
        before any attempt, raise `LimiterTimeout`."""
        last = self.last
        if last is None:
            msg = (f"{self.request.method} {_loggable(self.request.url)} not sent: the limiter "
                   f"had no token within max_time ({self.policy.max_time:g}s)")
            raise LimiterTimeout(msg, request=self.request)
        outcome = (f"status {last.status_code}" if isinstance(last, httpx.Response)
                   else f"{type(last).__name__}: {last}")
        self._give_up("max_time", outcome, None)
        if isinstance(last, BaseException):
            raise last
        if self.should_raise(last):
            raise self.exhausted(last)
        return last

    def permit(self) -> Permit | None:
        """Ask the breaker, if any, for leave to send one attempt; raise if it refuses."""
        breaker = self._transport.breaker
        if breaker is None:
            return None
        permit = breaker.try_acquire()
        if permit is None:
            raise self._refused(breaker)
        return permit

    def release(self, permit: Permit | None) -> None:
        """Give back an unused permit: the attempt was never sent."""
        if permit is not None:
            permit.release()

    def record(self, permit: Permit | None, outcome: httpx.Response | BaseException) -> None:
        """Tell the breaker how an attempt went: 5xx and connection errors are failures."""
        if permit is None:
            return
        if isinstance(outcome, httpx.Response):
            if outcome.status_code >= 500:
                permit.record_failure()
            else:
                permit.record_success()
        elif isinstance(outcome, RETRY_ERRORS):
            permit.record_failure()
        else:
            permit.record_exception(outcome)  # the breaker's rules; a cancellation frees the slot

    def check_breaker(self, wait: float, error: BaseException | None) -> None:
        """Fail now rather than wait for a retry the open breaker would refuse anyway."""
        breaker = self._transport.breaker
        if breaker is not None and breaker.remaining_cooldown > wait:
            raise self._refused(breaker) from error

    def _refused(self, breaker: CircuitBreaker) -> CircuitOpenTransportError:
        state = breaker.state
        return CircuitOpenTransportError(
            breaker.remaining_cooldown, breaker.name, state, request=self.request
        )

    def check_replayable(self) -> None:
        """Decide once, before the first attempt, whether this request may be sent again."""
        method = self.request.method.upper()
        self.resendable = isinstance(self.request.stream, httpx.ByteStream)
        self.replayable = self.resendable and (
            method in self.policy.retry_methods or _valid_key(self.request.headers))

    def after_response(self, response: httpx.Response) -> float | None:
        """Return the wait before the next attempt, or None to hand ``response`` back."""
        transport = self._transport
        limiter = transport.limiter
        retryable = response.status_code in self.policy.retry_statuses
        if limiter is not None and limiter.adaptive:
            now = transport._wall_clock()
            quota = read_quota(response.headers, now)
            if quota is not None:
                # When Retry-After and the quota headers disagree, Retry-After wins.
                retry_after = retry_after_hint(response.headers, now)
                limiter.update(quota.remaining,
                               quota.reset_after if retry_after is None else retry_after)
        if not retryable:
            if transport.retry_budget is not None:
                transport.retry_budget.record_success()
            return None
        hint = self._hint(response)
        if hint is not None and limiter is not None and response.status_code == 429:
            limiter.update(0, hint)
        return self._next_wait(hint, f"status {response.status_code}")

    def after_error(self, error: httpx.TransportError) -> float | None:
        """Return the wait before the next attempt, or None to re-raise ``error``."""
        unsent = isinstance(error, UNSENT_ERRORS)
        return self._next_wait(None, f"{type(error).__name__}: {error}", unsent=unsent)

    def should_raise(self, response: httpx.Response) -> bool:
        """Whether to raise instead of returning this last, retryable response."""
        return self.policy.raise_on_give_up and response.status_code in self.policy.retry_statuses

    def exhausted(self, response: httpx.Response) -> RetriesExhausted:
        """Build the error for a retryable response we stopped at."""
        msg = (
            f"gave up on {self.request.method} {_loggable(self.request.url)} after "
            f"{self.attempt + 1} attempt(s) ({self._reason}); last status {response.status_code}"
        )
        return RetriesExhausted(msg, request=self.request, response=response, reason=self._reason)

    def _hint(self, response: httpx.Response) -> float | None:
        """Return the first server hint the policy's parsers find.

        A parser that raises is a bug in it, logged; the response must still be
        closed and the retry go on, so it counts as no hint.
        """
        now = self._transport._wall_clock()
        for parse in self.policy.hints:
            try:
                wait = parse(response.headers, now)
            except Exception:
                logger.exception("hint parser %r failed; ignoring it", parse)
                continue
            if wait is not None and wait >= 0 and math.isfinite(wait):
                return wait
        return None

    def _next_wait(self, hint: float | None, outcome: str, *, unsent: bool = False,
                   ) -> float | None:
        """Count a failed attempt and schedule the next one, or return None to stop."""
        transport, policy = self._transport, self.policy
        if transport.retry_budget is not None:
            transport.retry_budget.record_failure()
        if hint is not None:
            wait = hint
        else:
            wait = full_jitter(
                self.attempt,
                base=policy.backoff_base,
                cap=policy.backoff_cap,
                random=transport._random,
            )
        reason = self._stop_reason(wait, unsent)
        if reason is not None:
            self._give_up(reason, outcome, wait)
            return None
        self.attempt += 1
        logger.info(
            "retrying %s %s after %s: attempt %d in %.3fs",
            self.request.method,
            _loggable(self.request.url),
            outcome,
            self.attempt,
            wait,
            extra={
                "attempt": self.attempt,
                "wait": wait,
                "outcome": outcome,
                "method": self.request.method,
                "url": _loggable(self.request.url),
            },
        )
        return wait

    def _stop_reason(self, wait: float, unsent: bool = False) -> GiveUpReason | None:
        """Return why no retry may follow after waiting ``wait`` seconds, or None
        (``unsent``: the attempt failed before sending anything)."""
        policy, budget = self.policy, self._transport.retry_budget
        if not (self.replayable or (unsent and self.resendable)):
            return "not_replayable"
        if self.attempt >= policy.max_retries:
            return "max_retries"
        if budget is not None and not budget.can_retry():
            return "retry_budget"
        if wait > LONGEST_WAIT:
            return "max_time"
        if policy.max_time is not None:
            # The limiter's queue is waited for too before the retry is sent: counted in.
            limiter = self._transport.limiter
            queued = limiter.delay(1, after=wait) if limiter is not None else 0.0
            if self._elapsed() + wait + queued > policy.max_time:
                return "max_time"
        return None

    def _give_up(self, reason: GiveUpReason, outcome: str, wait: float | None) -> None:
        """Remember and log why no retry follows (``wait`` None: the limiter had no
        token in time)."""
        self._reason = reason
        if reason != "not_replayable":
            logger.warning(
                "giving up on %s %s after %s: %s (%s)",
                self.request.method,
                _loggable(self.request.url),
                outcome,
                reason,
                "the limiter had no token in time" if wait is None
                else f"next wait would be {wait:.3f}s",
            )


def _loggable(url: httpx.URL) -> str:
    """The URL without query string, fragment or credentials, safe for logs."""
    return str(url.copy_with(query=None, fragment=None, userinfo=b""))


def _valid_key(headers: httpx.Headers) -> bool:
    """Whether ``headers`` carry an ``Idempotency-Key`` a server would honour: not blank,
    at most 255 characters (an empty one gets a 400, or is ignored: replaying the
    request would risk doing it twice)."""
    key = headers.get("idempotency-key", "").strip()
    return 0 < len(key) <= 255

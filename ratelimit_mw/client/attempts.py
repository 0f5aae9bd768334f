"""One request's retry bookkeeping: what each outcome means and how long to wait next.

The sync and async loops of `RetryTransport` do the I/O; everything they decide is here.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING, NamedTuple

from ..breaker import CircuitBreaker, Permit
from .backoff import full_jitter
from .bucket import LONGEST_PAUSE, TokenBucket
from .budget import RetryBudget
from .circuit import record_outcome, refuse_if_open
from .errors import GiveUpReason, LimiterTimeout, RetriesExhausted
from .hints import read_quota, retry_after_hint
from .log import log_give_up, log_retry, loggable_url, logger
from .metrics import ClientMetrics
from .policy import RETRY_ERRORS, UNSENT_ERRORS, RetryPolicy
from .replay import add_idempotency_key, body_resendable, safe_to_replay

if TYPE_CHECKING:
    import httpx

__all__ = ["Attempts", "Retrying"]


class Retrying(NamedTuple):
    """What a transport retries with: its policy, what it shares across requests, and
    its clocks and randomness (injectable for tests)."""

    policy: RetryPolicy
    retry_budget: RetryBudget | None
    limiter: TokenBucket | None
    breaker: CircuitBreaker | None
    clock: Callable[[], float]
    wall_clock: Callable[[], float]
    random: Callable[[], float]
    metrics: ClientMetrics | None = None


class Attempts:
    """One request's retry bookkeeping, shared by the sync and async loops."""

    __slots__ = ("_give_up_reason", "_started", "_transport", "body_resendable",
                 "keeps_last_outcome", "last_outcome", "policy", "replayable", "request",
                 "retries", "skipped_wait")

    def __init__(self, transport: Retrying, request: httpx.Request) -> None:
        self._transport = transport
        self.request = request
        self.policy = transport.policy.for_request(request)
        self.retries = 0
        self.replayable = True
        self.body_resendable = True
        self._give_up_reason: GiveUpReason = "max_retries"
        self._started = transport.clock()
        self.skipped_wait = 0.0
        """Seconds of waiting skipped in testing mode, counted as if waited."""
        self.last_outcome: httpx.Response | httpx.HTTPError | None = None
        """The last attempt's outcome, handed back if the limiter has no token in time."""
        # Only with a limiter and a time budget can a retry fail after its wait: then the
        # response is read before it is closed, so that it can still be handed back.
        self.keeps_last_outcome = transport.limiter is not None and self.policy.max_time is not None
        add_idempotency_key(request, self.policy)

    def decide_replayable(self) -> None:
        """Decide once, after any buffering and before the first attempt, whether this
        request may be sent again."""
        self.body_resendable = body_resendable(self.request)
        self.replayable = self.body_resendable and safe_to_replay(self.request, self.policy)

    def time_left(self) -> float | None:
        """Seconds left of ``max_time`` (None: no budget)."""
        if self.policy.max_time is None:
            return None
        return self.policy.max_time - self._elapsed()

    def _elapsed(self) -> float:
        return self._transport.clock() - self._started + self.skipped_wait

    def sending(self) -> None:
        """An attempt goes out now (counted by the metrics, if any)."""
        metrics = self._transport.metrics
        if metrics is not None:
            metrics.client_attempt(self.request.url.host)

    def no_token_in_time(self) -> httpx.Response:
        """Give up because the limiter had no token within ``max_time``: hand back the
        last response (or raise it as `RetriesExhausted`, or raise the last error);
        before any attempt, raise `LimiterTimeout`."""
        last = self.last_outcome
        if last is None:
            msg = (f"{self.request.method} {loggable_url(self.request.url)} not sent: the "
                   f"limiter had no token within max_time ({self.policy.max_time:g}s)")
            raise LimiterTimeout(msg, request=self.request)
        outcome = (f"{type(last).__name__}: {last}" if isinstance(last, BaseException)
                   else f"status {last.status_code}")
        self._give_up("max_time", outcome, None)
        if isinstance(last, BaseException):
            raise last
        if self.should_raise(last):
            raise self.exhausted_error(last)
        return last

    def wait_after_response(self, permit: Permit | None, response: httpx.Response,
                            ) -> float | None:
        """Record ``response``; return the wait before the next attempt, or None to hand
        it back."""
        record_outcome(permit, response)
        transport = self._transport
        limiter = transport.limiter
        retryable = response.status_code in self.policy.retry_statuses
        if limiter is not None and limiter.adaptive:
            now = transport.wall_clock()
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
        hint = self._server_hint(response)
        if hint is not None and limiter is not None and response.status_code == 429:
            limiter.update(0, hint)
        return self._next_wait(hint, f"status {response.status_code}",
                               cause=str(response.status_code))

    def wait_after_error(self, permit: Permit | None, error: BaseException) -> float | None:
        """Record ``error``; return the wait before the next attempt, or None to re-raise it.

        Raises `CircuitOpenTransportError` rather than wait for a retry the breaker
        would refuse anyway.
        """
        record_outcome(permit, error)
        if not isinstance(error, RETRY_ERRORS):
            return None
        unsent = isinstance(error, UNSENT_ERRORS)
        wait = self._next_wait(None, f"{type(error).__name__}: {error}", unsent=unsent,
                               cause=type(error).__name__)
        if wait is None:
            return None
        refuse_if_open(self._transport.breaker, self.request, longer_than=wait, cause=error)
        self.last_outcome = error
        return wait

    def should_raise(self, response: httpx.Response) -> bool:
        """Whether to raise instead of returning this last, retryable response."""
        return self.policy.raise_on_give_up and response.status_code in self.policy.retry_statuses

    def exhausted_error(self, response: httpx.Response) -> RetriesExhausted:
        """Build the error for a retryable response we stopped at."""
        reason = self._give_up_reason
        msg = (
            f"gave up on {self.request.method} {loggable_url(self.request.url)} after "
            f"{self.retries + 1} attempt(s) ({reason}); last status {response.status_code}"
        )
        return RetriesExhausted(msg, request=self.request, response=response, reason=reason)

    def _server_hint(self, response: httpx.Response) -> float | None:
        """Return the first server hint the policy's parsers find.

        A parser that raises is a bug in it, logged; the response must still be
        closed and the retry go on, so it counts as no hint.
        """
        now = self._transport.wall_clock()
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
                   cause: str = "") -> float | None:
        """Count a failed attempt and schedule the next one, or return None to stop
        (``cause``: the status code or error class, for the metrics)."""
        transport, policy = self._transport, self.policy
        if transport.retry_budget is not None:
            transport.retry_budget.record_failure()
        if hint is not None:
            wait = hint
        else:
            wait = full_jitter(
                self.retries,
                base=policy.backoff_base,
                cap=policy.backoff_cap,
                random=transport.random,
            )
        reason = self._stop_reason(wait, unsent)
        if reason is not None:
            self._give_up(reason, outcome, wait)
            return None
        self.retries += 1
        log_retry(self.request, outcome, self.retries, wait)
        if transport.metrics is not None:
            transport.metrics.client_retry(self.request.url.host, cause, wait)
        return wait

    def _stop_reason(self, wait: float, unsent: bool = False) -> GiveUpReason | None:
        """Return why no retry may follow after waiting ``wait`` seconds, or None
        (``unsent``: the attempt failed before sending anything)."""
        policy, budget = self.policy, self._transport.retry_budget
        if not (self.replayable or (unsent and self.body_resendable)):
            return "not_replayable"
        if self.retries >= policy.max_retries:
            return "max_retries"
        if budget is not None and not budget.can_retry():
            return "retry_budget"
        if wait > LONGEST_PAUSE:
            # Even without max_time, a server asking for more than a day gets its
            # response back rather than a wait that long.
            return "max_time"
        if policy.max_time is not None:
            # The limiter's queue is waited for too before the retry is sent: counted in.
            limiter = self._transport.limiter
            queued = limiter.delay(1, after=wait) if limiter is not None else 0.0
            if self._elapsed() + wait + queued > policy.max_time:
                return "max_time"
        return None

    def _give_up(self, reason: GiveUpReason, outcome: str, wait: float | None) -> None:
        """Remember why no retry follows, and log it unless the request was never
        replayable (``wait`` None: the limiter had no token in time)."""
        self._give_up_reason = reason
        metrics = self._transport.metrics
        if metrics is not None:
            metrics.client_give_up(self.request.url.host, reason)
        if reason != "not_replayable":
            log_give_up(self.request, outcome, reason, wait)

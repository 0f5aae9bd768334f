"""Requests held for their turn: the leaky bucket as a queue.

A limit with ``max_delay`` (``Limit("2/second", "leaky_bucket", max_delay="5s")``)
admits a request whose turn is up to that far ahead, its place taken in the same atomic
decision as every other limit of the request, so the turns of every worker form one
schedule. ``Turns`` (one per middleware) then holds the request until its turn, without
blocking the loop, and lets it into the app. While held it counts against the worker's
``max_held_requests``; a request past that cap, or whose client leaves while held, gets
no turn after all, and its charges are given back (a leaky bucket's turn too: the
schedule moves up by one interval for whoever asks next) where the storage settles
charges (memory, Redis); elsewhere they stay. A concurrency slot is taken
as the request enters the app, not while it waits.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Awaitable, Callable
from typing import NamedTuple

from starlette.types import Message, Receive, Send

from .asgi import Header
from .decision import Adjustment, Lease, Verdict
from .holds import Holds
from .limiter import Limiter
from .metrics import Metrics
from .outcome import Outcome
from .responses import Refusals, send_response

__all__ = ["Turn", "Turns", "turn_delay"]


class Turn(NamedTuple):
    """A held request let into the app: what it reads its body from (what came while it
    was held, then the rest), the concurrency slots it took on entering, and the
    ``Server-Timing`` header saying how long it waited."""

    receive: Receive
    leases: tuple[Lease, ...]
    headers: list[Header]


def turn_delay(verdict: Verdict) -> float:
    """Seconds until an admitted verdict's turn: the longest wait of its shaped limits
    (0 when none waits)."""
    delay = 0.0
    for decision in verdict.decisions:
        if decision.allowed and decision.retry_after > delay and decision.limit.max_delay:
            delay = decision.retry_after
    return delay


class Turns:
    """The requests this worker holds for their turn, at most ``cap`` at once."""

    __slots__ = ("_holds", "_limiter", "_metrics", "cap", "held")

    def __init__(self, limiter: Limiter, holds: Holds, *, cap: int,
                 metrics: Metrics | None = None) -> None:
        self._limiter = limiter
        self._holds = holds
        self._metrics = metrics
        self.cap = cap
        self.held = 0

    async def take(self, outcome: Outcome, verdict: Verdict, receive: Receive, send: Send,
                   refuse: Callable[[Outcome], Awaitable[None]]) -> Turn | None:
        """Hold an admitted shaped request until its turn, then take its concurrency
        slot; None when it got no turn after all (answered here, or by ``refuse`` for
        a slot refused, and its charges given back)."""
        delay = turn_delay(verdict)
        tier = outcome.limit_set.tier.name
        metrics = self._metrics
        waited = 0.0
        if delay > 0:
            if self.held >= self.cap:
                await self._give_back(outcome, verdict)
                if metrics is not None:
                    metrics.hold_given_up("full")
                await send_response(send, *Refusals.held_too_many(
                    outcome.headers, max(1, math.ceil(delay))))
                return None
            loop = asyncio.get_running_loop()
            started = loop.time()
            self.held += 1
            if metrics is not None:
                metrics.held(tier, 1)
            try:  # not a finally: see RateLimitMiddleware._holding
                held = await _held(receive, delay)
            except BaseException as exc:
                self._let_go(tier)
                self._give_back_soon(outcome, verdict)
                raise exc
            self._let_go(tier)
            if held is None:  # the client left
                await self._give_back(outcome, verdict)
                if metrics is not None:
                    metrics.hold_given_up("left")
                return None
            receive = held
            waited = loop.time() - started
            if metrics is not None:
                metrics.waited(tier, waited)
        leases: tuple[Lease, ...] = ()
        entering = outcome.limit_set.entering
        if entering is not None:
            charge = (outcome.key, entering)
            entered = self._limiter.decide_now(charge) or await self._limiter.decide(charge)
            if entered.refused:
                await self._give_back(outcome, verdict)
                await refuse(entered)
                return None
            if entered.verdict is not None:
                leases = entered.verdict.leases
        headers = outcome.headers
        if waited:
            headers = [*headers, (b"server-timing", b"ratelimit;dur=%d" % round(waited * 1000))]
        return Turn(receive, leases, headers)

    async def _give_back(self, outcome: Outcome, verdict: Verdict) -> None:
        """Give back what a request that never reaches the app was charged, where its
        storage settles charges (elsewhere they stay: its turn passes unused)."""
        adjustments = self._charged(outcome, verdict)
        if adjustments:
            await self._holds.settle(adjustments, outcome.source)

    def _give_back_soon(self, outcome: Outcome, verdict: Verdict) -> None:
        """``_give_back``, without awaiting (the request is being cancelled)."""
        adjustments = self._charged(outcome, verdict)
        if adjustments:
            self._holds.settle_soon(adjustments, outcome.source)

    def _charged(self, outcome: Outcome, verdict: Verdict) -> list[Adjustment]:
        if not self._holds.storage_of(outcome.source).settles:
            return []
        return _charged(outcome, verdict)

    def _let_go(self, tier: str) -> None:
        self.held -= 1
        if self._metrics is not None:
            self._metrics.held(tier, -1)



def _charged(outcome: Outcome, verdict: Verdict) -> list[Adjustment]:
    """What giving back an admitted request's charges takes: each charged hit less its
    cost (slots aside: a held request has none yet)."""
    limit_set = outcome.limit_set
    # A verdict a shadow limit denied was decided again on the enforced limits alone.
    charged = (limit_set.hits if all(d.allowed for d in verdict.decisions)
               else limit_set.enforced)
    at = verdict.at if verdict.at is not None else outcome.now
    return [Adjustment(outcome.key, hit, -hit.cost, at) for hit in charged
            if hit.cost and not hit.limit.is_concurrency]


async def _held(receive: Receive, delay: float) -> Receive | None:
    """Wait ``delay`` seconds, reading meanwhile what the client sends: None when it
    disconnects, else the ``receive`` that gives the app what came first."""
    came: list[Message] = []
    turn = asyncio.ensure_future(asyncio.sleep(delay))
    while True:
        reading = asyncio.ensure_future(receive())
        await asyncio.wait((turn, reading), return_when=asyncio.FIRST_COMPLETED)
        if not reading.done():
            reading.cancel()
            await asyncio.wait((reading,))
        if reading.done() and not reading.cancelled():
            message = reading.result()
            if message["type"] == "http.disconnect":
                turn.cancel()
                return None
            came.append(message)
        if turn.done():
            break
    if not came:
        return receive

    async def replaying() -> Message:
        return came.pop(0) if came else await receive()

    return replaying

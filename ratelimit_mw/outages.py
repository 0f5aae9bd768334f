"""A path's storage outages in the log: the first failure in one line, the rest counted,
and one line when the path works again, so an outage of any length logs two lines a path.

The decision path keeps its own account (``failure.GuardedStorage``, which also counts
by cause for the metrics); each other path that meets the storage (quota reads,
idempotency, slot releases and renewals, settlements, the shared breaker) holds an
``OutageLog``. A path that can't tell when a call succeeds (a slot given back without
awaiting) ends its outage after ``quiet`` seconds without a failure.
"""

from __future__ import annotations

import asyncio
import logging
import time

from .errors import describe_error

__all__ = ["QUIET_SECONDS", "OutageLog"]

_log = logging.getLogger("ratelimit_mw")

QUIET_SECONDS = 10.0
"""Seconds without a failure after which an outage counts as over, when no success says so."""


class OutageLog:
    """The outages of one path (``what``: "quota read", "slot release" …): ``failed``
    at each failure, ``succeeded`` at each success where the path can tell.

    Logs ``event`` with the first failure's error and ``consequence`` (what callers
    meet meanwhile), then ``recovered`` with the failures counted and the ``items`` they
    carried (slots, charges), when a call succeeds or ``quiet`` seconds (default
    ``QUIET_SECONDS``) pass without one.
    """

    __slots__ = ("_began", "_failures", "_items", "_last", "_timer", "consequence", "event",
                 "logger", "quiet", "recovered", "what")

    def __init__(self, what: str, event: str, consequence: str, *, recovered: str = "",
                 quiet: float | None = None, logger: logging.Logger = _log) -> None:
        self.what = what
        self.event = event
        self.recovered = recovered or f"{event}_recovered"
        self.consequence = consequence
        self.quiet = QUIET_SECONDS if quiet is None else quiet
        self.logger = logger
        self._began: float | None = None  # when the outage going on began (monotonic)
        self._last = 0.0  # its latest failure
        self._failures = 0
        self._items = 0
        self._timer: asyncio.TimerHandle | None = None

    def __repr__(self) -> str:
        state = f"failing, {self._failures} failure(s)" if self.failing else "working"
        return f"OutageLog({self.what!r}, {state})"

    @property
    def failing(self) -> bool:
        """True from a failure until the path works again."""
        return self._began is not None

    def failed(self, error: BaseException | str, items: int = 1) -> None:
        """A call of the path failed with ``error``, carrying ``items`` (slots, charges)."""
        now = time.monotonic()
        if self._began is not None and now - self._last >= self.quiet:
            self._end(self._last)  # the earlier outage is over (its timer never ran)
        self._last = now
        if self._began is not None:
            self._failures += 1
            self._items += items
            return
        self._began = now
        self._failures, self._items = 1, items
        text = error if isinstance(error, str) else describe_error(error)
        self.logger.warning(
            "ratelimit_mw %s failed: event=%s error=%s; %s (further failures are counted "
            "until it works again)", self.what, self.event, text, self.consequence,
            extra={"ratelimit": {"event": self.event, "error": text}})
        self._arm(self.quiet)

    def succeeded(self) -> None:
        """A call of the path succeeded: an outage going on is over."""
        if self._began is not None:
            self._end(time.monotonic())

    def _arm(self, delay: float) -> None:
        """Look again in ``delay`` seconds whether the failures have stopped."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return  # no loop to wait on: the next failure or success ends the outage
        self._timer = loop.call_later(delay, self._check)

    def _check(self) -> None:
        self._timer = None
        if self._began is None:
            return
        idle = time.monotonic() - self._last
        if idle >= self.quiet:
            self._end(self._last)
        else:
            self._arm(self.quiet - idle)

    def _end(self, at: float) -> None:
        """The outage is over as of ``at``: its count, in one line."""
        began, self._began = self._began, None
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        seconds = max(0.0, at - (began or at))
        # Items only where a failure carries several (slots, charges).
        items = f" items={self._items}" if self._items != self._failures else ""
        self.logger.warning(
            "ratelimit_mw %s recovered: event=%s failures=%d%s seconds=%.1f",
            self.what, self.recovered, self._failures, items, seconds,
            extra={"ratelimit": {"event": self.recovered, "failures": self._failures,
                                 "items": self._items, "seconds": seconds}})

"""Observability: the event every decision hook receives, and the denial log line."""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from typing import Literal, NamedTuple

from .decision import Verdict

__all__ = ["DecisionEvent", "DecisionHook", "Source", "log_denial"]

Source = Literal["storage", "blocked", "fallback", "unavailable", "override"]
"""Where a verdict came from: the storage, the local cache of blocked keys, the
in-memory fallback (``memory`` failure mode), nowhere (storage down), or an
override that blocks the caller."""

_log = logging.getLogger("ratelimit_mw")


class DecisionEvent(NamedTuple):
    """One request's rate-limit decision, as a metrics hook sees it.

    ``refused``: answered 429 (or 503 when the storage is down and the policy is
    ``closed``). ``shadow``: a limit denied it but shadow mode let it through.
    ``verdict`` is None when the storage could not decide. (A NamedTuple: one is made
    per request while a hook is set, and a tuple is the cheapest to make.)
    """

    key: str
    tier: str
    route: str
    source: Source
    verdict: Verdict | None
    refused: bool
    shadow: bool


DecisionHook = Callable[[DecisionEvent], None]


def log_denial(key: str, tier: str, route: str, verdict: Verdict, *, shadow: bool,
               source: Source) -> None:
    """One structured line per denial (``shadow=True``: it was let through)."""
    if not _log.isEnabledFor(logging.INFO):
        return
    binding = verdict.binding
    policy = binding.limit.name if binding is not None else ""
    retry = verdict.retry_after
    fields = {
        "event": "rate_limited",
        "key": key[:200],
        "tier": tier,
        "route": route,
        "policy": policy,
        "retry_after": retry if math.isfinite(retry) else None,
        "shadow": shadow,
        "source": source,
    }
    _log.info(
        "ratelimit_mw denied: event=rate_limited key=%s tier=%s route=%s policy=%s "
        "retry_after=%.3f shadow=%s source=%s",
        fields["key"], tier, route or "-", policy, retry, shadow, source,
        extra={"ratelimit": fields},
    )


def call_hook(hook: DecisionHook, event: DecisionEvent) -> None:
    """Run the metrics hook; a broken hook is logged, never fails the request."""
    try:
        hook(event)
    except Exception:
        _log.exception("ratelimit_mw: the on_decision hook raised")

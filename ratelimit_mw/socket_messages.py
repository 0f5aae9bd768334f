"""Limits on the messages a websocket connection receives: one connect, many messages.

Opt-in (``websocket_messages`` per caller, on the shared storage across all of a
caller's connections; ``websocket_connection_messages`` per connection, counted in
the worker that holds it). A message over either limit closes the socket with 1008
and a reason, or, with ``websocket_over_limit="drop"``, is dropped unseen by the app.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable
from typing import Any

from starlette.types import Message, Receive, Send

from .errors import ConfigError
from .failure import GuardedStorage
from .hits import Hit
from .limits import Limit, as_limits, run
from .metrics import Metrics

__all__ = ["CLOSE_REASON", "MessageLimits"]

CLOSE_REASON = "message rate limit exceeded"
_SCOPE = "websocket messages"
"""The scope of the per-caller counter: apart from any limit of the caller's requests."""


def _one_limit(value: str, setting: str) -> Limit | None:
    """The limit a setting writes as a rate (``"20/second"``), or None when unset."""
    if not value:
        return None
    limits = as_limits(value)
    if len(limits) != 1:
        msg = f"{setting}={value!r} names {len(limits)} rates; give one, e.g. '20/second'"
        raise ConfigError(msg)
    return limits[0]


class MessageLimits:
    """Counts each websocket message against the connection's limit and the caller's."""

    __slots__ = ("_caller", "_connection", "_drop", "_guarded", "_metrics")

    def __init__(self, guarded: GuardedStorage, *, per_caller: str, per_connection: str,
                 over_limit: str, metrics: Metrics | None = None) -> None:
        caller = _one_limit(per_caller, "websocket_messages")
        self._caller = None if caller is None else Hit(caller, 1, _SCOPE)
        self._connection = _one_limit(per_connection, "websocket_connection_messages")
        if over_limit not in ("close", "drop"):
            msg = f"websocket_over_limit={over_limit!r}; expected 'close' or 'drop'"
            raise ConfigError(msg)
        self._drop = over_limit == "drop"
        self._guarded = guarded
        self._metrics = metrics

    @property
    def on(self) -> bool:
        """Whether any message limit is set."""
        return self._caller is not None or self._connection is not None

    def receiving(self, key: str, receive: Receive, send: Send) -> Receive:
        """``receive`` for the connection of the caller ``key``: messages over a limit
        close the socket (the app then receives a disconnect) or are dropped."""
        counted: list[Any] = [None]  # the connection's own counter

        async def limited() -> Message:
            while True:
                message = await receive()
                if message["type"] != "websocket.receive":
                    return message
                refused = self._refused_here(counted) or await self._refused_for(key)
                if refused is None:
                    return message
                if self._metrics is not None:
                    self._metrics.websocket_message_refused(
                        refused, "dropped" if self._drop else "closed")
                if self._drop:
                    continue
                await send({"type": "websocket.close", "code": 1008, "reason": CLOSE_REASON})
                return {"type": "websocket.disconnect", "code": 1008, "reason": CLOSE_REASON}

        return limited

    def _refused_here(self, counted: list[Any]) -> str | None:
        """``"connection"`` when the message is over the connection's limit."""
        limit = self._connection
        if limit is None:
            return None
        step = run(limit, counted[0], time.time_ns() // 1000, 1)
        if not step[0]:
            return "connection"
        counted[0] = step[4]
        return None

    def _refused_for(self, key: str) -> Awaitable[str | None]:
        """``"caller"`` when the message is over the caller's limit (on the storage,
        under the failure policy)."""
        hit = self._caller
        if hit is None:
            return _nothing()
        return self._decide(key, hit)

    async def _decide(self, key: str, hit: Hit) -> str | None:
        guarded = self._guarded
        verdict = guarded.decide_now(key, (hit,))
        if verdict is None:
            verdict, _ = await guarded.decide(key, (hit,))
        if verdict is None:  # the storage can't decide: the failure policy says
            return "caller" if guarded.mode == "closed" else None
        return None if verdict.allowed else "caller"


async def _nothing() -> None:
    return None

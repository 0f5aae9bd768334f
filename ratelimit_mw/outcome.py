"""What deciding a request comes to."""

from __future__ import annotations

from .asgi import Header
from .decision import Verdict
from .events import Source
from .limit_sets import LimitSet

__all__ = ["Charge", "Outcome"]


Charge = tuple[str, LimitSet]
"""What a request counts against: its caller's key, and its limit set."""


class Outcome:
    """What deciding a request comes to: its verdict (None: the storage could not
    decide), where it came from, whether the request is refused, and the headers to
    send."""

    __slots__ = ("headers", "key", "limit_set", "now", "refused", "response", "source", "verdict")

    def __init__(self, key: str, limit_set: LimitSet, verdict: Verdict | None, source: Source,
                 refused: bool, headers: list[Header], now: float) -> None:
        self.key = key
        self.limit_set = limit_set
        self.verdict = verdict
        self.source = source
        self.refused = refused
        self.headers = headers
        self.now = now
        self.response: tuple[bytes, bytes, list[Header]] | None = None
        """The 429 as sent (content type, body, headers), kept by the outcome a blocked
        key's requests share, so that each of them is answered with it."""

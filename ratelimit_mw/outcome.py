"""What deciding a request comes to."""

from __future__ import annotations

from typing import Final

from .asgi import Header
from .decision import Verdict
from .events import Source
from .limit_sets import LimitSet

__all__ = ["Charge", "Outcome", "Rendered"]


Charge = tuple[str, LimitSet]
"""What a request counts against: its caller's key, and its limit set."""

Rendered = tuple[int, bytes, bytes, list[Header]]
"""A refusal ready to send: status, content type, body and headers (see
``responses.Refusals``)."""


class Outcome:
    """What deciding a request comes to, made once and never changed (its attributes
    are ``Final``: the cache of blocked keys hands one outcome to many requests): its
    verdict (None: the storage could not decide), where it came from, whether the
    request is refused, the headers to send, and the refusal to send as it is (None:
    the request goes on, or the app's ``on_denied`` makes the answer)."""

    __slots__ = ("headers", "key", "limit_set", "now", "refused", "response", "source",
                 "verdict")

    # A plain class, not a frozen dataclass: compiled, its generated __init__ would set
    # each field through object.__setattr__, on every request.
    def __init__(self, key: str, limit_set: LimitSet, verdict: Verdict | None, source: Source,
                 refused: bool, headers: list[Header], now: float,
                 response: Rendered | None = None) -> None:
        self.key: Final = key
        self.limit_set: Final = limit_set
        self.verdict: Final = verdict
        self.source: Final = source
        self.refused: Final = refused
        self.headers: Final = headers
        self.now: Final = now
        self.response: Final = response

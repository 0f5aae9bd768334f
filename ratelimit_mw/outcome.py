"""What deciding a request comes to."""

from __future__ import annotations

from dataclasses import dataclass

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


@dataclass(frozen=True, slots=True, eq=False)
class Outcome:
    """What deciding a request comes to, made once and never changed: its verdict (None:
    the storage could not decide), where it came from, whether the request is refused,
    the headers to send, and the refusal to send as it is (None: the request goes on,
    or the app's ``on_denied`` makes the answer)."""

    key: str
    limit_set: LimitSet
    verdict: Verdict | None
    source: Source
    refused: bool
    headers: list[Header]
    now: float
    response: Rendered | None = None

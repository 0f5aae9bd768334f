"""What the storage-fault tests count: the kinds of failed storage calls, over a
one-route app."""

from __future__ import annotations

from collections import Counter

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route

from ratelimit_mw.metrics import ErrorKind, Metrics

__all__ = ["ErrorKinds", "hello_app"]


class ErrorKinds(Metrics):
    """Metrics that keep the kinds of failed storage calls."""

    __slots__ = ("kinds",)

    def __init__(self) -> None:
        self.kinds: Counter[ErrorKind] = Counter()

    def storage_error(self, kind: ErrorKind) -> None:
        self.kinds[kind] += 1


async def _hello(request: Request) -> Response:
    return PlainTextResponse("hello")


def hello_app() -> Starlette:
    """``GET /`` says hello."""
    return Starlette(routes=[Route("/", _hello)])

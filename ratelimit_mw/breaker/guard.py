"""Answer 503 at once while a circuit breaker rests, instead of calling the route.

`BreakerGuard` wraps an ASGI app (a whole app as middleware, a ``Mount``, or one
route's endpoint); `breaker_dependency` is the same check as a FastAPI dependency.
The 503 carries ``Retry-After``: the breaker's remaining cooldown rounded up
(at least 1), or 1 while it is half-open with every trial slot taken.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable

from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ..errors import ConfigError
from ..responses import error_body
from .circuit_breaker import CircuitBreaker
from .core import Permit
from .state import CircuitOpenError, CircuitState, refusal_in

__all__ = [
    "BreakerGuard",
    "CircuitRefusal",
    "breaker_dependency",
    "circuit_open_handler",
    "guarding_breaker",
    "unavailable_response",
]

_GUARDS = "__ratelimit_breaker__"
"""The attribute of a ``breaker_dependency`` function that holds its breaker."""


def _retry_after(remaining: float, state: CircuitState) -> int:
    """Whole seconds to wait: the cooldown rounded up, never 0; 1 when half-open."""
    if state is not CircuitState.OPEN:
        return 1
    return max(1, math.ceil(remaining))


def _refusal(breaker: CircuitBreaker) -> CircuitOpenError | None:
    """The error for a call the breaker refuses right now, or None if it would admit one.

    A trial slot taken to ask is given back at once, so asking never uses one up.
    """
    permit = breaker.try_acquire()
    if permit is not None:
        permit.release()
        return None
    return CircuitOpenError(breaker.remaining_cooldown, breaker.name, breaker.state)


def _body(error: CircuitOpenError) -> tuple[dict[str, object], dict[str, str]]:
    """The JSON body and headers of the 503 for ``error``."""
    seconds = _retry_after(error.remaining, error.state)
    if error.state is CircuitState.OPEN:
        message = f"A service this endpoint depends on is failing; retry in {seconds}s."
    else:
        message = "A service this endpoint depends on is recovering; retry in a second."
    content = error_body("service_unavailable", message, retry_after_seconds=seconds,
                         circuit=error.name, circuit_state=str(error.state))
    return content, {"Retry-After": str(seconds), "Cache-Control": "no-store"}


def unavailable_response(error: CircuitOpenError) -> JSONResponse:
    """The 503 answer for a refused call: JSON body, ``Retry-After``, ``no-store``.

    Usable as a Starlette/FastAPI exception handler body::

        app.add_exception_handler(CircuitOpenError, lambda request, exc: unavailable_response(exc))
    """
    content, headers = _body(error)
    return JSONResponse(content, status_code=503, headers=headers)


async def circuit_open_handler(request: Request, exc: Exception) -> Response:
    """A Starlette/FastAPI exception handler for `CircuitOpenError`: the 503 of
    `unavailable_response` (``app.add_exception_handler(CircuitOpenError,
    circuit_open_handler)``), marked as a refusal for the guards around."""
    if not isinstance(exc, CircuitOpenError):
        raise exc
    _mark_refused(request.scope)
    return unavailable_response(exc)


class BreakerGuard:
    """ASGI wrapper that refuses requests with a 503 while ``breaker`` refuses calls.

    With ``record=True`` (the default) the wrapped app *is* the protected call:
    each request takes a permit, counted once when the app is done, its time the
    time to the response's start: a status >= ``failure_status`` or an exception
    (also while the body streams, or in a background task after it) is a failure,
    anything else a success; a client that goes away counts the status answered
    before it left (none: the permit is freed), and a 503 by which a breaker
    inside refused counts nothing. With ``record=False`` the guard only
    looks: the code that calls the dependency records through the same breaker
    (``await breaker.call(...)``), and the guard spares the handler while it
    rests. Either way a `CircuitOpenError` that escapes the app before the
    response started (alone, or in the exception group of a task group that
    fanned out) becomes the same 503 (install the guard as middleware for
    that: a Starlette app wrapped whole answers its own errors with a 500 first).

    >>> from starlette.applications import Starlette
    >>> from starlette.middleware import Middleware
    >>> db = CircuitBreaker(name="db", cooldown=30)
    >>> app = Starlette(middleware=[Middleware(BreakerGuard, breaker=db)])
    """

    __slots__ = ("app", "breaker", "failure_status", "record")

    def __init__(
        self,
        app: ASGIApp,
        breaker: CircuitBreaker,
        *,
        record: bool = True,
        failure_status: int = 500,
    ) -> None:
        if not isinstance(breaker, CircuitBreaker):
            msg = f"breaker must be a CircuitBreaker, got {breaker!r}"
            raise TypeError(msg)
        if isinstance(failure_status, bool) or not isinstance(failure_status, int) or not (
            100 <= failure_status <= 599
        ):
            msg = f"failure_status must be an HTTP status from 100 to 599, got {failure_status!r}"
            raise ConfigError(msg)
        self.app = app
        self.breaker = breaker
        self.record = record
        self.failure_status = failure_status

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        breaker = self.breaker
        if not self.record:
            refusal = _refusal(breaker)
            if refusal is not None:
                await _refuse(refusal, scope, receive, send)
                return
            await self._call_app(scope, _Call(receive, send))
            return

        permit = breaker.try_acquire()
        if permit is None:
            error = CircuitOpenError(breaker.remaining_cooldown, breaker.name, breaker.state)
            await _refuse(error, scope, receive, send)
            return

        # The call's time ends when its response starts (the dependency's time, not a
        # client reading a stream nor a background task after it); its outcome is
        # counted when the app is done, once: a body that breaks is a failure.
        call = _Call(receive, send, permit.stop_clock)
        try:
            await self._call_app(scope, call)
        except BaseException as exc:
            if call.gone:
                # The client went away: the status answered by then is what the
                # dependency said; with none yet, nothing is said of it.
                self._count_status(permit, call.outcome(), scope)
            elif refusal_in(exc) is not None or isinstance(exc, ClientDisconnect):
                pass  # a breaker inside refused, or the client left: nothing was tried
            elif call.status >= self.failure_status:
                self._count_status(permit, call.status, scope)  # the 500 already sent
            else:
                # By the breaker's rules; a cancellation only frees the slot.
                permit.record_exception(exc)
            raise
        else:
            self._count_status(permit, call.outcome(), scope)
        finally:
            permit.release()

    def _count_status(self, permit: Permit, status: int, scope: Scope) -> None:
        """Count the answered ``status``; no response, or a 503 by which a breaker
        inside refused, counts nothing."""
        if status and not _refused_in(scope):
            if status < self.failure_status:
                permit.record_success()
            else:
                permit.record_failure()

    async def _call_app(self, scope: Scope, call: _Call) -> None:
        """Run the app, and turn a refusal inside, before the response, into a 503."""
        try:
            await self.app(scope, call.receive, call.send)
        except BaseException as exc:
            refusal = refusal_in(exc)
            if refusal is None or call.status:
                raise
            # Through the call's own send: a client gone meanwhile is seen as gone.
            await _refuse(refusal, scope, call.receive, call.send)


class _Call:
    """The app's side of one guarded request: the status it answered (0: none yet),
    and whether the client went away while it was answered (a disconnect received
    before the response's last body, or a send that failed), with the status
    answered by then (what the app answers after, a 500 for the disconnect,
    says nothing of the dependency)."""

    __slots__ = ("answered", "gone", "on_start", "status", "status_when_gone",
                 "upstream_receive", "upstream_send")

    def __init__(self, receive: Receive, send: Send,
                 on_start: Callable[[], None] | None = None) -> None:
        self.upstream_receive = receive
        self.upstream_send = send
        self.on_start = on_start
        self.status = 0
        self.status_when_gone = 0
        self.answered = False
        self.gone = False

    def outcome(self) -> int:
        """The status that counts: the one answered before the client went away."""
        return self.status_when_gone if self.gone else self.status

    def _leave(self) -> None:
        if not self.gone:
            self.gone = True
            self.status_when_gone = self.status

    async def receive(self) -> Message:
        message = await self.upstream_receive()
        # After the last body the server reports a disconnect to whoever still listens
        # (Starlette's StreamingResponse does): that is the response done, not the
        # client leaving, and a background task after it still counts.
        if message["type"] == "http.disconnect" and not self.answered:
            self._leave()
        return message

    async def send(self, message: Message) -> None:
        kind = message["type"]
        if kind == "http.response.start":
            self.status = message["status"]
            if self.on_start is not None:
                self.on_start()
        try:
            await self.upstream_send(message)
        except OSError:
            self._leave()  # the client's connection, not the dependency
            raise
        if kind == "http.response.body" and not message.get("more_body", False):
            self.answered = True


_REFUSED = "ratelimit_mw.circuit_refused"
"""Set in ``scope["state"]`` when a breaker's refusal answers the request."""


async def _refuse(error: CircuitOpenError, scope: Scope, receive: Receive, send: Send) -> None:
    """Answer the 503 for ``error``, marked as a refusal for the guards around."""
    _mark_refused(scope)
    await unavailable_response(error)(scope, receive, send)


def _mark_refused(scope: Scope) -> None:
    state = scope.get("state")
    if state is None:
        state = scope["state"] = {}
    state[_REFUSED] = True


def _refused_in(scope: Scope) -> bool:
    state = scope.get("state")
    return bool(state is not None and state.get(_REFUSED))


class CircuitRefusal(CircuitOpenError, HTTPException):
    """The refusal ``breaker_dependency`` raises: a `CircuitOpenError`, answered by
    `circuit_open_handler` with the library's top-level body; also an ``HTTPException``
    (503, ``Retry-After``), so an app without that handler still answers 503."""

    def __init__(self, error: CircuitOpenError) -> None:
        # Not CircuitOpenError.__init__: its super() here is HTTPException's, which takes
        # the message for a status code (Starlette before 1.7 raises on it).
        self.remaining, self.name, self.state = error.remaining, error.name, error.state
        content, headers = _body(error)
        HTTPException.__init__(self, 503, detail=content, headers=headers)  # type: ignore[arg-type]

    def __str__(self) -> str:
        return Exception.__str__(self)

    def __reduce__(self) -> tuple[type[CircuitOpenError], tuple[float, str, CircuitState]]:
        return CircuitOpenError, (self.remaining, self.name, self.state)


def breaker_dependency(breaker: CircuitBreaker) -> Callable[[Request], Awaitable[None]]:
    """A FastAPI dependency that answers 503 while ``breaker`` refuses calls.

    It only looks (no trial slot is held): record outcomes where the dependency
    is called, through the breaker. It raises a `CircuitRefusal`: install
    `circuit_open_handler` (``document_limits`` does) and the 503 has the body every
    answer of the library has, with ``Retry-After``; without it, FastAPI's own
    handler answers the 503 as ``{"detail": {...}}``. The breaker may still refuse
    the call itself (it opened meanwhile, or a request beside took the one
    half-open trial): that refusal is answered by the same handler (without it,
    a 500)::

        db = CircuitBreaker(name="db")
        app.add_exception_handler(CircuitOpenError, circuit_open_handler)

        @app.get("/orders", dependencies=[Depends(breaker_dependency(db))])
        async def orders() -> list[Order]:
            return await db.call(fetch_orders)
    """
    if not isinstance(breaker, CircuitBreaker):
        msg = f"breaker must be a CircuitBreaker, got {breaker!r}"
        raise TypeError(msg)

    async def check_circuit(request: Request) -> None:
        refusal = _refusal(breaker)
        if refusal is not None:
            _mark_refused(request.scope)
            raise CircuitRefusal(refusal)

    check_circuit.__name__ = f"check_circuit_{breaker.name}"
    setattr(check_circuit, _GUARDS, breaker)
    return check_circuit


def guarding_breaker(call: object) -> CircuitBreaker | None:
    """The breaker of a ``breaker_dependency`` function, or None for anything else."""
    breaker = getattr(call, _GUARDS, None)
    return breaker if isinstance(breaker, CircuitBreaker) else None

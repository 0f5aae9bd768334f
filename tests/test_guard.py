"""BreakerGuard and breaker_dependency: 503 with Retry-After while a dependency rests."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import httpx
import pytest
from fastapi import Depends, FastAPI
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Mount, Route

from ratelimit_mw.breaker import CircuitBreaker, CircuitOpenError, CircuitState
from ratelimit_mw.breaker.guard import BreakerGuard, breaker_dependency, unavailable_response
from ratelimit_mw.errors import ConfigError
from tests.conftest import FakeClock

COOLDOWN = 30.0


class Handler:
    """An endpoint that counts its calls and answers with the status it is told."""

    def __init__(self) -> None:
        self.calls = 0
        self.status = 200

    async def endpoint(self, request: Request) -> Response:
        self.calls += 1
        if self.status == 0:
            raise RuntimeError("boom")
        return JSONResponse({"ok": self.status < 500}, status_code=self.status)


@pytest.fixture
def breaker(clock: FakeClock) -> CircuitBreaker:
    """Opens when 2 of the last 4 calls failed; rests 30 s; one trial call."""
    return CircuitBreaker(
        name="db", window_size=4, minimum_calls=4, failure_rate_threshold=50, cooldown=COOLDOWN,
        clock=clock,
    )


def client_for(app: Callable[..., object]) -> httpx.AsyncClient:
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)  # type: ignore[arg-type]
    return httpx.AsyncClient(transport=transport, base_url="http://test")


def guarded_app(handler: Handler, breaker: CircuitBreaker, **options: Any) -> Starlette:
    return Starlette(
        routes=[Route("/orders", handler.endpoint, methods=["GET", "POST"])],
        middleware=[Middleware(BreakerGuard, breaker=breaker, **options)],
    )


def state_of(breaker: CircuitBreaker) -> CircuitState:
    """The breaker's state now (a call, so type checkers don't carry an earlier narrowing)."""
    return breaker.state


async def trip(client: httpx.AsyncClient, handler: Handler) -> None:
    """Send four failing requests, which opens the breaker."""
    handler.status = 503
    for _ in range(4):
        assert (await client.get("/orders")).status_code == 503
    handler.status = 200


async def test_open_breaker_answers_503_without_calling_the_handler(
    breaker: CircuitBreaker, clock: FakeClock
) -> None:
    """Above the failure threshold the route answers 503 with Retry-After and a JSON body."""
    handler = Handler()
    async with client_for(guarded_app(handler, breaker)) as client:
        await trip(client, handler)
        assert breaker.state is CircuitState.OPEN
        clock.advance(10)
        response = await client.post("/orders", json={"item": 1})
    assert handler.calls == 4
    assert response.status_code == 503
    assert response.headers["retry-after"] == "20"
    assert response.headers["cache-control"] == "no-store"
    body = response.json()
    assert body["error"] == "service_unavailable"
    assert body["retry_after_seconds"] == 20
    assert (body["circuit"], body["circuit_state"]) == ("db", "open")


@pytest.mark.parametrize(
    ("elapsed", "retry_after"), [(0.0, "30"), (10.5, "20"), (29.001, "1"), (29.9999, "1")]
)
async def test_retry_after_is_the_cooldown_rounded_up(
    breaker: CircuitBreaker, clock: FakeClock, elapsed: float, retry_after: str
) -> None:
    """Retry-After is the remaining cooldown rounded up, and at least 1."""
    handler = Handler()
    async with client_for(guarded_app(handler, breaker)) as client:
        await trip(client, handler)
        clock.advance(elapsed)
        response = await client.get("/orders")
    assert response.headers["retry-after"] == retry_after


async def test_recovers_after_the_cooldown(breaker: CircuitBreaker, clock: FakeClock) -> None:
    """After the cooldown a trial request reaches the handler and its success closes the breaker."""
    handler = Handler()
    async with client_for(guarded_app(handler, breaker)) as client:
        await trip(client, handler)
        clock.advance(COOLDOWN)
        assert breaker.state is CircuitState.HALF_OPEN
        assert (await client.get("/orders")).status_code == 200
        assert state_of(breaker) is CircuitState.CLOSED
        assert (await client.get("/orders")).status_code == 200
    assert handler.calls == 6


async def test_failed_trial_opens_again(breaker: CircuitBreaker, clock: FakeClock) -> None:
    """A trial request that fails opens the breaker for a new cooldown."""
    handler = Handler()
    async with client_for(guarded_app(handler, breaker)) as client:
        await trip(client, handler)
        clock.advance(COOLDOWN)
        handler.status = 500
        assert (await client.get("/orders")).status_code == 500
        response = await client.get("/orders")
    assert response.status_code == 503
    assert response.headers["retry-after"] == "30"


async def test_half_open_with_its_slot_taken_answers_retry_after_1(
    breaker: CircuitBreaker, clock: FakeClock
) -> None:
    """While the one trial call is running, other requests get 503 with Retry-After: 1."""
    handler = Handler()
    async with client_for(guarded_app(handler, breaker)) as client:
        await trip(client, handler)
        clock.advance(COOLDOWN)
        probe = breaker.try_acquire()  # a trial request still in flight
        assert probe is not None
        response = await client.get("/orders")
        probe.release()
    assert response.status_code == 503
    assert response.headers["retry-after"] == "1"
    assert response.json()["circuit_state"] == "half_open"
    assert handler.calls == 4


async def test_exceptions_count_as_failures(breaker: CircuitBreaker) -> None:
    """A handler that raises counts as a failed call."""
    handler = Handler()
    handler.status = 0
    async with client_for(guarded_app(handler, breaker)) as client:
        for _ in range(4):
            assert (await client.get("/orders")).status_code == 500
        assert (await client.get("/orders")).status_code == 503
    assert handler.calls == 4


async def test_4xx_counts_as_success(breaker: CircuitBreaker) -> None:
    """Client errors are answers: they never open the breaker."""
    handler = Handler()
    handler.status = 404
    async with client_for(guarded_app(handler, breaker)) as client:
        for _ in range(6):
            assert (await client.get("/orders")).status_code == 404
    assert breaker.state is CircuitState.CLOSED


async def test_look_only_guard_with_the_dependency_recording(
    breaker: CircuitBreaker, clock: FakeClock
) -> None:
    """With record=False the handler's own breaker calls count, and the guard spares it."""
    calls = 0

    async def flaky_dependency() -> str:
        raise ConnectionError("db down")

    async def endpoint(request: Request) -> Response:
        nonlocal calls
        calls += 1
        try:
            await breaker.call(flaky_dependency)
        except ConnectionError:
            return JSONResponse({"error": "db"}, status_code=502)
        return JSONResponse({})

    app = Starlette(routes=[Mount("/", BreakerGuard(Starlette(routes=[Route("/x", endpoint)]),
                                                    breaker, record=False))])
    async with client_for(app) as client:
        for _ in range(4):
            assert (await client.get("/x")).status_code == 502
        response = await client.get("/x")
    assert response.status_code == 503
    assert response.headers["retry-after"] == "30"
    assert calls == 4


async def test_refusal_raised_inside_becomes_503(breaker: CircuitBreaker, clock: FakeClock) -> None:
    """A CircuitOpenError escaping the handler is answered like the guard's own refusal."""

    async def endpoint(request: Request) -> Response:
        raise CircuitOpenError(7.2, "search")

    app = Starlette(
        routes=[Route("/x", endpoint)], middleware=[Middleware(BreakerGuard, breaker=breaker)]
    )
    async with client_for(app) as client:
        response = await client.get("/x")
    assert response.status_code == 503
    assert response.headers["retry-after"] == "8"
    assert response.json()["circuit"] == "search"
    assert "0/0 calls failed" in repr(breaker)  # not this route's failure


@pytest.mark.parametrize("handled", [True, False], ids=["with-handler", "without-handler"])
async def test_fastapi_dependency(breaker: CircuitBreaker, clock: FakeClock, handled: bool) -> None:
    """The FastAPI dependency answers 503 with Retry-After and never runs the route; with
    circuit_open_handler installed the body is the library's top-level one (the 429's
    shape), without it FastAPI's own ``{"detail": ...}``."""
    from ratelimit_mw.breaker.guard import circuit_open_handler

    calls = 0
    app = FastAPI()
    if handled:
        app.add_exception_handler(CircuitOpenError, circuit_open_handler)

    @app.get("/items", dependencies=[Depends(breaker_dependency(breaker))])
    async def items() -> dict[str, int]:
        nonlocal calls
        calls += 1
        return {"n": calls}

    async with client_for(app) as client:
        assert (await client.get("/items")).json() == {"n": 1}
        for _ in range(4):
            breaker.acquire().record_failure()
        clock.advance(0.5)
        response = await client.get("/items")
        assert calls == 1
        assert response.status_code == 503
        assert response.headers["retry-after"] == "30"
        body = response.json() if handled else response.json()["detail"]
        assert body == {
            "error": "service_unavailable",
            "message": "A service this endpoint depends on is failing; retry in 30s.",
            "retry_after_seconds": 30, "circuit": breaker.name, "circuit_state": "open"}
        clock.advance(COOLDOWN)
        assert (await client.get("/items")).status_code == 200


def test_unavailable_response_body() -> None:
    """The 503 response is JSON with the wait in whole seconds."""
    response = unavailable_response(CircuitOpenError(0.2, "db"))
    assert response.status_code == 503
    assert response.headers["retry-after"] == "1"
    assert json.loads(bytes(response.body))["retry_after_seconds"] == 1


async def test_lifespan_passes_through(breaker: CircuitBreaker) -> None:
    """Non-HTTP scopes go to the app untouched."""
    seen: list[str] = []

    async def app(scope: dict[str, object], receive: object, send: object) -> None:
        seen.append(str(scope["type"]))

    await BreakerGuard(app, breaker)({"type": "lifespan"}, None, None)  # type: ignore[arg-type]
    assert seen == ["lifespan"]


@pytest.mark.parametrize("status", [True, 99, 600, "500"])
def test_bad_failure_status_is_refused(breaker: CircuitBreaker, status: object) -> None:
    """failure_status must be an HTTP status code."""
    with pytest.raises(ConfigError, match="failure_status"):
        BreakerGuard(Handler().endpoint, breaker, failure_status=status)  # type: ignore[arg-type]


async def test_a_refusal_inside_is_not_the_outer_guards_failure(
    breaker: CircuitBreaker, clock: FakeClock,
) -> None:
    """An app-wide guard around a route whose own breaker refuses (breaker_dependency's
    503, an inner guard's 503, a CircuitOpenError raised through call()): nothing was
    tried, so the app's breaker counts nothing and the app's other routes stay up."""
    from ratelimit_mw.breaker.guard import circuit_open_handler

    db = CircuitBreaker(name="inner-db", window_size=2, minimum_calls=2, cooldown=60,
                        clock=clock)
    for _ in range(2):
        db.acquire().record_failure()
    assert state_of(db) is CircuitState.OPEN

    async def fetch() -> None:
        return None

    app = FastAPI()
    app.add_middleware(BreakerGuard, breaker=breaker)
    app.add_exception_handler(CircuitOpenError, circuit_open_handler)

    @app.get("/orders", dependencies=[Depends(breaker_dependency(db))])
    async def orders() -> None:
        return None

    @app.get("/direct")
    async def direct() -> None:
        await db.call(fetch)  # refused: CircuitOpenError, answered by the handler

    @app.get("/ok")
    async def ok() -> dict[str, str]:
        return {"ok": "yes"}

    async with client_for(app) as client:
        refused = [(await client.get(path)).status_code for path in ["/orders", "/direct"] * 3]
        after = await client.get("/ok")
    assert refused == [503] * 6
    assert after.status_code == 200
    assert state_of(breaker) is CircuitState.CLOSED
    assert "0/1 calls failed" in repr(breaker)  # /ok, and nothing else


async def test_call_inside_call_gives_the_outer_permit_back(clock: FakeClock) -> None:
    """``outer.call(f)`` where ``f`` is refused by an open inner breaker: the outer
    breaker counts nothing (it opened after two such calls)."""
    outer = CircuitBreaker(name="service", window_size=2, minimum_calls=2, clock=clock)
    inner = CircuitBreaker(name="db", window_size=2, minimum_calls=2, clock=clock)
    for _ in range(2):
        inner.acquire().record_failure()

    async def handler() -> None:
        async def query() -> None:
            return None
        await inner.call(query)

    for _ in range(3):
        with pytest.raises(CircuitOpenError):
            await outer.call(handler)
    assert state_of(outer) is CircuitState.CLOSED


@pytest.mark.parametrize(("options", "match"), [
    ({"failure_exceptions": ()}, "no call could ever count as a failure"),
    ({"slow_call_rate_threshold": 50}, "needs slow_call_duration"),
])
def test_settings_that_do_nothing_are_refused(options: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        CircuitBreaker(**options)
    CircuitBreaker(failure_exceptions=(), is_failure_result=lambda result: result is None)


async def test_a_calls_time_ends_when_its_response_starts(clock: FakeClock) -> None:
    """The time of a call is the time to its response's start: a background task (or a
    client reading a stream slowly) after it makes no call slow."""
    from starlette.background import BackgroundTask

    breaker = CircuitBreaker(name="app", window_size=4, minimum_calls=4, clock=clock,
                             slow_call_duration=1.0, slow_call_rate_threshold=50)

    async def later() -> None:
        clock.advance(5.0)  # a background task that takes five seconds

    async def signup(request: Request) -> Response:
        return JSONResponse({"ok": True}, background=BackgroundTask(later))

    app = Starlette(routes=[Route("/signup", signup, methods=["POST"])],
                    middleware=[Middleware(BreakerGuard, breaker=breaker)])
    async with client_for(app) as client:
        codes = [(await client.post("/signup")).status_code for _ in range(5)]
    assert codes == [200] * 5
    assert state_of(breaker) is CircuitState.CLOSED


async def test_a_trial_that_breaks_mid_stream_opens_again_and_counts_once(
    clock: FakeClock,
) -> None:
    """One outcome per call: responses that start 200 and break mid-stream are failures
    (four open the breaker), a half-open trial whose body breaks opens it again (it is
    not a success first), and a 500 whose body breaks is one failure."""
    from starlette.responses import StreamingResponse

    breaker = CircuitBreaker(name="up", window_size=4, minimum_calls=4, cooldown=COOLDOWN,
                             clock=clock, probe_timeout=1.0)
    status = 200

    async def endpoint(request: Request) -> Response:
        async def chunks() -> Any:
            yield b"first"
            clock.advance(5.0)  # a long stream: longer than probe_timeout
            raise ConnectionError("upstream dropped mid-stream")

        return StreamingResponse(chunks(), status_code=status)

    app = Starlette(routes=[Route("/feed", endpoint)],
                    middleware=[Middleware(BreakerGuard, breaker=breaker)])
    async with client_for(app) as client:
        for _ in range(4):
            await client.get("/feed")
        assert state_of(breaker) is CircuitState.OPEN
        clock.advance(COOLDOWN)
        assert state_of(breaker) is CircuitState.HALF_OPEN
        await client.get("/feed")
        assert state_of(breaker) is CircuitState.OPEN
    other = CircuitBreaker(name="once", window_size=4, minimum_calls=2, clock=clock)
    status = 500
    app = Starlette(routes=[Route("/feed", endpoint)],
                    middleware=[Middleware(BreakerGuard, breaker=other)])
    async with client_for(app) as client:
        await client.get("/feed")
    assert "1/1 calls failed" in repr(other)


async def test_a_trial_whose_stream_never_ends_gives_its_slot_back_at_its_deadline(
    clock: FakeClock,
) -> None:
    """A half-open trial that started its response and then streams on for ever does
    not wedge the breaker: at probe_timeout its slot goes back (counted neither way)."""
    import asyncio

    breaker = CircuitBreaker(name="dep", window_size=2, minimum_calls=2, cooldown=5,
                             probe_timeout=10, clock=clock)
    for _ in range(2):
        breaker.acquire().record_failure()
    clock.advance(6)
    forever = asyncio.Event()

    async def stream(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"chunk", "more_body": True})
        await forever.wait()

    guard = BreakerGuard(stream, breaker=breaker)
    sent: list[Any] = []

    async def send(message: Any) -> None:
        sent.append(message)

    async def receive() -> Any:
        await asyncio.sleep(3600)

    scope = {"type": "http", "method": "GET", "path": "/", "headers": []}
    trial = asyncio.create_task(guard(scope, receive, send))
    await asyncio.sleep(0.01)
    assert breaker.try_acquire() is None  # the one trial slot is taken
    clock.advance(11)  # past its probe_timeout
    permit = breaker.try_acquire()
    assert permit is not None
    permit.record_success()
    assert state_of(breaker) is CircuitState.CLOSED
    trial.cancel()


async def test_a_client_that_goes_away_is_no_failure(breaker: CircuitBreaker) -> None:
    """The client leaving while its body is read (Starlette's ClientDisconnect): the
    permit goes back, nothing is counted; a send that fails on its connection after
    a 200 is that 200's success, no failure."""
    import asyncio

    async def upload(request: Request) -> Response:
        await request.body()
        return JSONResponse({"ok": True})

    guard = BreakerGuard(Starlette(routes=[Route("/u", upload, methods=["POST"])]),
                         breaker=breaker)

    async def gone() -> Any:
        return {"type": "http.disconnect"}

    async def send(message: Any) -> None:
        return None

    async def broken(message: Any) -> None:
        if message["type"] == "http.response.body":
            raise OSError("connection reset by peer")

    scope = {"type": "http", "method": "POST", "path": "/u", "headers": [],
             "query_string": b""}
    with pytest.raises(ClientDisconnect):
        await guard(dict(scope), gone, send)
    ok_body = [{"type": "http.request", "body": b"x", "more_body": False}]

    async def one() -> Any:
        return ok_body.pop() if ok_body else await asyncio.sleep(3600)

    with pytest.raises(OSError):
        await guard(dict(scope), one, broken)
    assert "0/1 calls failed" in repr(breaker)


async def test_a_refusal_inside_counts_nothing_whatever_failure_status(
    clock: FakeClock,
) -> None:
    """With failure_status above 503, an inner breaker's 503 is still no success."""
    outer = CircuitBreaker(name="outer", window_size=2, minimum_calls=2, clock=clock)
    inner = CircuitBreaker(name="inner", window_size=2, minimum_calls=2, clock=clock,
                           cooldown=60)
    for _ in range(2):
        inner.acquire().record_failure()

    async def endpoint(request: Request) -> Response:
        async def query() -> None:
            return None
        await inner.call(query)
        return JSONResponse({"ok": True})

    app = Starlette(routes=[Route("/x", endpoint)], middleware=[
        Middleware(BreakerGuard, breaker=outer, failure_status=504),
        Middleware(BreakerGuard, breaker=inner, record=False)])
    async with client_for(app) as client:
        assert (await client.get("/x")).status_code == 503
    assert "0/0 calls failed" in repr(outer)


def streaming_with_failing_task(breaker: CircuitBreaker) -> Starlette:
    """A guarded app whose ``/feed`` streams a body, then runs a background task that
    fails (a write-behind to the dependency)."""
    from starlette.background import BackgroundTask
    from starlette.responses import StreamingResponse

    async def push_upstream() -> None:
        raise ConnectionError("upstream refused the write-behind")

    async def endpoint(request: Request) -> Response:
        async def chunks() -> Any:
            yield b"done"

        return StreamingResponse(chunks(), background=BackgroundTask(push_upstream))

    return Starlette(routes=[Route("/feed", endpoint)],
                     middleware=[Middleware(BreakerGuard, breaker=breaker)])


async def test_a_background_task_that_fails_after_a_stream_counts_a_failure(
    breaker: CircuitBreaker,
) -> None:
    """Starlette's StreamingResponse listens for a disconnect, and the server reports
    one once the last body is sent: that is the response done, not the client gone,
    so the background task that fails after it is a failure of the dependency."""
    async with client_for(streaming_with_failing_task(breaker)) as client:
        for _ in range(4):
            assert (await client.get("/feed")).status_code == 200
    assert state_of(breaker) is CircuitState.OPEN


@pytest.mark.parametrize("http", ["h11", "httptools"])
def test_a_failing_background_task_counts_under_uvicorn(clock: FakeClock, http: str) -> None:
    """The same through a real uvicorn, whose receive reports the disconnect once the
    response is complete: the background task's failures open the breaker."""
    import time

    from tests.servers import serve

    breaker = CircuitBreaker(name="db", window_size=4, minimum_calls=4, clock=clock)
    app = streaming_with_failing_task(breaker)
    # uvicorn closes a connection whose app raised: one connection per request.
    with serve(app, http=http) as url, httpx.Client(
        base_url=url, headers={"Connection": "close"},
    ) as client:
        for _ in range(4):
            assert client.get("/feed").status_code == 200
        deadline = time.monotonic() + 5
        while state_of(breaker) is not CircuitState.OPEN and time.monotonic() < deadline:
            time.sleep(0.01)  # the last background task runs after its response
        assert state_of(breaker) is CircuitState.OPEN
        assert client.get("/feed").status_code == 503


async def test_an_answer_after_the_client_left_counts_nothing(breaker: CircuitBreaker) -> None:
    """An app that answers a 500 itself because the client went away before the
    response says nothing of the dependency."""

    async def app(scope: Any, receive: Any, send: Any) -> None:
        assert (await receive())["type"] == "http.disconnect"
        await send({"type": "http.response.start", "status": 500, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    async def gone() -> Any:
        return {"type": "http.disconnect"}

    async def send(message: Any) -> None:
        return None

    await BreakerGuard(app, breaker=breaker)({"type": "http", "path": "/"}, gone, send)
    assert "0/0 calls failed" in repr(breaker)


async def test_a_client_reset_after_the_status_counts_the_status(
    breaker: CircuitBreaker,
) -> None:
    """The connection failing while the body is sent says nothing of the dependency,
    but the status already answered does: a 500 is a failure, a 200 a success."""
    handler = Handler()
    guard = BreakerGuard(Starlette(routes=[Route("/orders", handler.endpoint)]),
                         breaker=breaker)

    async def receive() -> Any:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def broken(message: Any) -> None:
        if message["type"] == "http.response.body":
            raise OSError("connection reset by peer")

    scope = {"type": "http", "method": "GET", "path": "/orders", "headers": [],
             "query_string": b""}
    handler.status = 500
    for _ in range(2):
        with pytest.raises(OSError):
            await guard(dict(scope), receive, broken)
    handler.status = 200
    with pytest.raises(OSError):
        await guard(dict(scope), receive, broken)
    assert "2/3 calls failed" in repr(breaker)


class DBError(Exception):
    pass


async def test_a_500_already_sent_is_a_failure_whatever_the_exception(clock: FakeClock) -> None:
    """A guard around a whole Starlette app: a handler bug (not one of the breaker's
    failure_exceptions) is answered 500 by Starlette, then re-raised: still a failure,
    as the same 500 returned would be."""
    breaker = CircuitBreaker(name="db", window_size=2, minimum_calls=2, clock=clock,
                             failure_exceptions=(DBError,))

    async def buggy(request: Request) -> Response:
        raise KeyError("order")

    guard = BreakerGuard(Starlette(routes=[Route("/", buggy)]), breaker=breaker)
    async with client_for(guard) as client:
        for _ in range(2):
            assert (await client.get("/")).status_code == 500
    assert state_of(breaker) is CircuitState.OPEN


async def test_a_refusal_inside_a_task_group_is_the_503_and_counts_nothing(
    clock: FakeClock,
) -> None:
    """A handler that fans out with a task group to a dependency whose breaker is open
    raises an ExceptionGroup of refusals: the guard answers its 503, and the outer
    breaker counts nothing (nothing was tried)."""
    import asyncio

    outer = CircuitBreaker(name="app", window_size=2, minimum_calls=2, clock=clock)
    inner = CircuitBreaker(name="db", window_size=2, minimum_calls=2, cooldown=60, clock=clock)
    for _ in range(2):
        inner.acquire().record_failure()

    async def query() -> int:
        return 1

    async def fan_out(request: Request) -> Response:
        async with asyncio.TaskGroup() as group:
            for _ in range(2):
                group.create_task(inner.call(query))
        return JSONResponse({"ok": True})

    app = Starlette(routes=[Route("/", fan_out)],
                    middleware=[Middleware(BreakerGuard, breaker=outer)])
    async with client_for(app) as client:
        for _ in range(3):
            response = await client.get("/")
            assert response.status_code == 503
            assert response.json()["circuit"] == "db"
    assert state_of(outer) is CircuitState.CLOSED
    assert "0/0 calls failed" in repr(outer)
    # breaker.call itself: a group of refusals only frees the slot.

    async def fan() -> None:
        async with asyncio.TaskGroup() as group:
            group.create_task(inner.call(query))

    with pytest.raises(ExceptionGroup):
        await outer.call(fan)
    assert "0/0 calls failed" in repr(outer)


async def test_a_refusal_the_client_cannot_receive_counts_nothing(
    clock: FakeClock,
) -> None:
    """The inner refusal's 503 fails to send (the client left): no failure counted."""
    outer = CircuitBreaker(name="app", window_size=2, minimum_calls=2, clock=clock)
    inner = CircuitBreaker(name="db", window_size=2, minimum_calls=2, cooldown=60, clock=clock)
    for _ in range(2):
        inner.acquire().record_failure()

    async def app(scope: Any, receive: Any, send: Any) -> None:
        raise CircuitOpenError(60, "db")

    async def receive() -> Any:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def broken(message: Any) -> None:
        raise OSError("connection reset by peer")

    for _ in range(2):
        with pytest.raises(OSError):
            await BreakerGuard(app, breaker=outer)({"type": "http", "path": "/"}, receive, broken)
    assert "0/0 calls failed" in repr(outer)

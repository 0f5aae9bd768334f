"""RetryTransport with a circuit breaker: fail fast while the dependency rests."""

from __future__ import annotations

import contextlib
import pickle

import httpx
import pytest

from ratelimit_mw.breaker import CircuitBreaker, CircuitOpenError, CircuitState
from ratelimit_mw.client import CircuitOpenTransportError, RetryPolicy, TokenBucket

from .conftest import FakeClock, Recorder, retrying

URL = "https://api.example.org/items"
NO_RETRY = RetryPolicy(max_retries=0)


def breaker_on(clock: FakeClock, **options: object) -> CircuitBreaker:
    """A breaker on the fake clock: opens after 2 failures of 2 calls, rests 30 s."""
    settings: dict[str, object] = {
        "name": "api",
        "window_size": 2,
        "minimum_calls": 2,
        "cooldown": 30.0,
    }
    settings.update(options)
    return CircuitBreaker(clock=clock, **settings)  # type: ignore[arg-type]


async def test_open_breaker_fails_fast_without_sending(clock: FakeClock) -> None:
    """An open breaker raises at once and the wrapped transport is never called."""
    breaker = breaker_on(clock)
    for _ in range(2):
        breaker.acquire().record_failure()
    clock.move(10)
    recorder = Recorder(httpx.Response(200))
    transport = retrying(recorder, clock, breaker=breaker)
    async with httpx.AsyncClient(transport=transport) as client:
        with pytest.raises(CircuitOpenTransportError) as caught:
            await client.get(URL)
    assert recorder.calls == 0
    assert caught.value.remaining == pytest.approx(20.0)
    assert caught.value.state is CircuitState.OPEN
    assert caught.value.request.url == URL


def test_error_is_both_an_httpx_error_and_a_breaker_error() -> None:
    """Callers can catch it as httpx.TransportError or as CircuitOpenError; it pickles."""
    error = CircuitOpenTransportError(12.5, "api")
    assert isinstance(error, httpx.TransportError)
    assert isinstance(error, CircuitOpenError)
    assert "12.5s" in str(error)
    copy = pickle.loads(pickle.dumps(error))
    assert (copy.remaining, copy.name) == (12.5, "api")


@pytest.mark.parametrize(
    "answer", [httpx.Response(500), httpx.Response(503), httpx.ConnectError("refused")]
)
async def test_server_errors_and_connection_errors_open_the_breaker(
    clock: FakeClock, answer: httpx.Response | Exception
) -> None:
    """5xx responses and connection errors count as failures."""
    breaker = breaker_on(clock)
    transport = retrying(Recorder(answer), clock, breaker=breaker, policy=NO_RETRY)
    async with httpx.AsyncClient(transport=transport) as client:
        for _ in range(2):
            with contextlib.suppress(httpx.ConnectError):
                await client.get(URL)
    assert breaker.state is CircuitState.OPEN


@pytest.mark.parametrize("status", [200, 404, 429])
async def test_other_statuses_are_successes(clock: FakeClock, status: int) -> None:
    """A 2xx or 4xx (even 429) means the dependency answered: the breaker stays closed."""
    breaker = breaker_on(clock)
    transport = retrying(Recorder(httpx.Response(status)), clock, breaker=breaker, policy=NO_RETRY)
    async with httpx.AsyncClient(transport=transport) as client:
        for _ in range(4):
            await client.get(URL)
    assert breaker.state is CircuitState.CLOSED


async def test_retries_stop_when_the_breaker_opens(clock: FakeClock) -> None:
    """Once the retries have opened the breaker, no wait and no further attempt follows."""
    breaker = breaker_on(clock)
    recorder = Recorder(httpx.Response(503))
    transport = retrying(recorder, clock, breaker=breaker, policy=RetryPolicy(max_retries=5))
    async with httpx.AsyncClient(transport=transport) as client:
        with pytest.raises(CircuitOpenTransportError) as caught:
            await client.get(URL)
    assert recorder.calls == 2
    assert clock.sleeps == [0.25]  # the wait between the two attempts, none after
    assert caught.value.remaining == pytest.approx(30.0)


async def test_recovers_after_the_cooldown(clock: FakeClock) -> None:
    """After the cooldown a trial request goes through, and its success closes the breaker."""
    breaker = breaker_on(clock)
    recorder = Recorder(httpx.Response(503), httpx.Response(503), httpx.Response(200))
    transport = retrying(recorder, clock, breaker=breaker, policy=NO_RETRY)
    async with httpx.AsyncClient(transport=transport) as client:
        for _ in range(2):
            assert (await client.get(URL)).status_code == 503
        with pytest.raises(CircuitOpenTransportError):
            await client.get(URL)
        clock.move(30)
        assert (await client.get(URL)).status_code == 200
    assert recorder.calls == 3
    assert breaker.state is CircuitState.CLOSED


def test_sync_client_fails_fast_too(clock: FakeClock) -> None:
    """The sync path asks the breaker as well."""
    breaker = breaker_on(clock)
    recorder = Recorder(httpx.Response(502))
    transport = retrying(recorder, clock, breaker=breaker, policy=NO_RETRY)
    with httpx.Client(transport=transport) as client:
        for _ in range(2):
            client.get(URL)
        with pytest.raises(CircuitOpenTransportError):
            client.get(URL)
    assert recorder.calls == 2


async def test_half_open_with_every_slot_taken_refuses(clock: FakeClock) -> None:
    """While the only trial call is out, another request is refused as half-open."""
    breaker = breaker_on(clock)
    for _ in range(2):
        breaker.acquire().record_failure()
    clock.move(30)
    probe = breaker.acquire()
    recorder = Recorder(httpx.Response(200))
    transport = retrying(recorder, clock, breaker=breaker)
    async with httpx.AsyncClient(transport=transport) as client:
        with pytest.raises(CircuitOpenTransportError) as caught:
            await client.get(URL)
    probe.release()
    assert caught.value.state is CircuitState.HALF_OPEN
    assert recorder.calls == 0


async def test_time_queued_in_the_limiter_is_not_a_slow_call(clock: FakeClock) -> None:
    """The breaker is asked just before sending: instant answers from a server reached
    through a slow limiter are not slow calls, and the breaker stays closed."""
    breaker = breaker_on(clock, window_size=4, minimum_calls=4, slow_call_duration=0.5)
    limiter = TokenBucket(rate=1, capacity=1, clock=clock, sleep=clock.auto_sleep)
    recorder = Recorder(httpx.Response(200))
    transport = retrying(recorder, clock, policy=NO_RETRY, breaker=breaker, limiter=limiter)
    async with httpx.AsyncClient(transport=transport) as client:
        for _ in range(5):
            assert (await client.get(URL)).status_code == 200
    assert clock.sleeps == [pytest.approx(1.0)] * 4  # each waited a second for a token
    assert breaker.state is CircuitState.CLOSED
    assert recorder.calls == 5


async def test_an_open_breaker_refuses_before_the_limiter_is_waited_for(
        clock: FakeClock) -> None:
    """While the breaker is open, a request fails at once: it neither queues in the
    limiter nor takes a token."""
    breaker = breaker_on(clock)
    limiter = TokenBucket(rate=0.01, capacity=1, clock=clock, sleep=clock.auto_sleep)
    recorder = Recorder(httpx.Response(503))
    transport = retrying(recorder, clock, policy=NO_RETRY, breaker=breaker)
    async with httpx.AsyncClient(transport=transport) as client:
        for _ in range(2):
            await client.get(URL)
    assert breaker.state is CircuitState.OPEN
    transport = retrying(recorder, clock, policy=NO_RETRY, breaker=breaker, limiter=limiter)
    async with httpx.AsyncClient(transport=transport) as client:
        with pytest.raises(CircuitOpenTransportError):
            await client.get(URL)
    assert limiter.tokens == 1
    assert clock.sleeps == []

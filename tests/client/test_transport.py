"""The retrying transport, driven through real httpx clients over MockTransport."""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import AsyncIterator, Iterator

import httpx
import pytest

from ratelimit_mw.client import (
    DEFAULT_HINTS,
    LimiterTimeout,
    RetriesExhausted,
    RetryBudget,
    RetryPolicy,
    RetryTransport,
    TokenBucket,
    arequest,
    duration_hint,
    request,
    set_testing,
)

from .conftest import WALL_NOW, FakeClock, Recorder, retrying

URL = "https://api.example.org/items?token=secret"


async def get_with(transport: RetryTransport, *, sync: bool) -> httpx.Response:
    """GET ``URL`` through ``transport`` from a sync or an async client."""
    if sync:
        with httpx.Client(transport=transport) as client:
            return client.get(URL)
    async with httpx.AsyncClient(transport=transport) as client:
        return await client.get(URL)


def answer(status: int, **headers: str) -> httpx.Response:
    """A canned response with headers given as keyword arguments."""
    return httpx.Response(status, headers={k.replace("_", "-"): v for k, v in headers.items()})


async def test_retry_after_then_success(clock: FakeClock) -> None:
    """A 429 with Retry-After is retried after exactly that wait."""
    recorder = Recorder(answer(429, retry_after="2"), answer(200))
    async with httpx.AsyncClient(transport=retrying(recorder, clock)) as client:
        response = await client.get(URL)
    assert response.status_code == 200
    assert recorder.calls == 2
    assert clock.sleeps == [2.0]


def test_sync_client_retry_after_then_success(clock: FakeClock) -> None:
    """The same transport works for a sync httpx.Client."""
    recorder = Recorder(answer(503, retry_after="3"), answer(200))
    with httpx.Client(transport=retrying(recorder, clock)) as client:
        response = client.get(URL)
    assert response.status_code == 200
    assert clock.sleeps == [3.0]


@pytest.mark.parametrize("status", [200, 201, 204, 301, 304, 400, 401, 403, 404, 409, 418, 422])
async def test_final_statuses_are_returned_at_once(clock: FakeClock, status: int) -> None:
    """2xx, 3xx and 4xx other than 408 and 429 are answers, not failures."""
    recorder = Recorder(answer(status, retry_after="1"))
    async with httpx.AsyncClient(transport=retrying(recorder, clock)) as client:
        response = await client.get(URL)
    assert response.status_code == status
    assert recorder.calls == 1
    assert clock.sleeps == []


@pytest.mark.parametrize("status", [408, 429, 500, 502, 503, 504])
async def test_retryable_statuses(clock: FakeClock, status: int) -> None:
    """408, 429 and the usual 5xx are retried."""
    recorder = Recorder(answer(status), answer(200))
    async with httpx.AsyncClient(transport=retrying(recorder, clock)) as client:
        assert (await client.get(URL)).status_code == 200
    assert recorder.calls == 2


@pytest.mark.parametrize(
    "error",
    [
        httpx.ConnectError("refused"),
        httpx.ConnectTimeout("slow"),
        httpx.ReadTimeout("slow"),
        httpx.PoolTimeout("busy"),
        httpx.ReadError("reset"),
        httpx.RemoteProtocolError("closed"),
    ],
)
async def test_connection_and_timeout_errors_are_retried(
    clock: FakeClock, error: httpx.TransportError
) -> None:
    """Connection and timeout errors are retried with backoff."""
    recorder = Recorder(error, answer(200))
    async with httpx.AsyncClient(transport=retrying(recorder, clock)) as client:
        assert (await client.get(URL)).status_code == 200
    assert clock.sleeps == [0.25]  # uniform draw 0.5 of base 0.5


async def test_last_error_is_raised_when_retries_run_out(clock: FakeClock) -> None:
    """After max_retries, the last connection error propagates unchanged."""
    recorder = Recorder(httpx.ConnectError("refused"))
    transport = retrying(recorder, clock, policy=RetryPolicy(max_retries=2))
    async with httpx.AsyncClient(transport=transport) as client:
        with pytest.raises(httpx.ConnectError, match="refused"):
            await client.get(URL)
    assert recorder.calls == 3


async def test_other_transport_errors_are_not_retried(clock: FakeClock) -> None:
    """Errors that another attempt cannot fix propagate at once."""
    recorder = Recorder(httpx.UnsupportedProtocol("gopher"))
    async with httpx.AsyncClient(transport=retrying(recorder, clock)) as client:
        with pytest.raises(httpx.UnsupportedProtocol):
            await client.get(URL)
    assert recorder.calls == 1


async def test_backoff_without_hint_doubles(clock: FakeClock) -> None:
    """Without a hint, waits follow the jittered exponential backoff."""
    recorder = Recorder(answer(503), answer(503), answer(503), answer(200))
    async with httpx.AsyncClient(transport=retrying(recorder, clock)) as client:
        assert (await client.get(URL)).status_code == 200
    assert clock.sleeps == [0.25, 0.5, 1.0]


async def test_max_retries_returns_the_last_response(clock: FakeClock) -> None:
    """When retries run out, the last retryable response is returned."""
    recorder = Recorder(answer(503))
    transport = retrying(recorder, clock, policy=RetryPolicy(max_retries=3))
    async with httpx.AsyncClient(transport=transport) as client:
        response = await client.get(URL)
    assert response.status_code == 503
    assert recorder.calls == 4
    assert response.content == b"body"


async def test_hint_is_never_truncated_by_the_cap(clock: FakeClock) -> None:
    """A server hint longer than backoff_cap is waited in full."""
    recorder = Recorder(answer(429, retry_after="100"), answer(200))
    policy = RetryPolicy(backoff_cap=1.0, max_time=None)
    async with httpx.AsyncClient(transport=retrying(recorder, clock, policy=policy)) as client:
        assert (await client.get(URL)).status_code == 200
    assert clock.sleeps == [100.0]


async def test_hint_longer_than_the_budget_returns_at_once(clock: FakeClock) -> None:
    """A wait that does not fit max_time is not started: the 429 comes back now."""
    recorder = Recorder(answer(429, retry_after="120"), answer(200))
    policy = RetryPolicy(max_time=60.0)
    async with httpx.AsyncClient(transport=retrying(recorder, clock, policy=policy)) as client:
        response = await client.get(URL)
    assert response.status_code == 429
    assert recorder.calls == 1
    assert clock.sleeps == []


async def test_budget_counts_time_spent_in_attempts(clock: FakeClock) -> None:
    """Slow attempts use up the budget: the retry that would end past it is skipped."""
    recorder = Recorder(answer(503, retry_after="10"))

    def slow(request: httpx.Request) -> httpx.Response:
        clock.move(20.0)
        return recorder(request)

    transport = RetryTransport(
        httpx.MockTransport(slow),
        policy=RetryPolicy(max_time=50.0, max_retries=10),
        clock=clock,
        async_sleep=clock.auto_sleep,
    )
    async with httpx.AsyncClient(transport=transport) as client:
        assert (await client.get(URL)).status_code == 503
    # 20 s + 10 s wait fits in 50; after the second attempt (50 s) another 10 s does not.
    assert recorder.calls == 2
    assert clock.sleeps == [10.0]


@pytest.mark.parametrize("sync", [False, True])
async def test_the_limiters_wait_counts_against_the_budget(clock: FakeClock, sync: bool) -> None:
    """Before a retry the limiter is waited for too: a retry whose hint plus the
    limiter's queue would end past max_time is not started (the 503 comes back)."""
    recorder = Recorder(answer(503, retry_after="0"), answer(200))
    # One token per 4 s, the first one taken by the first attempt: the retry would wait 4 s.
    limiter = TokenBucket(rate=0.25, capacity=1, clock=clock, sleep=clock.auto_sleep,
                          sleep_sync=clock.sleep)
    policy = RetryPolicy(max_time=1.0)
    transport = retrying(recorder, clock, policy=policy, limiter=limiter)
    response = await get_with(transport, sync=sync)
    assert response.status_code == 503
    assert recorder.calls == 1
    assert clock.now <= 1000.0 + 1.0  # no wait was started
    roomy = retrying(Recorder(answer(503, retry_after="0"), answer(200)), clock,
                     policy=RetryPolicy(max_time=10.0), limiter=limiter)
    async with httpx.AsyncClient(transport=roomy) as client:
        assert (await client.get(URL)).status_code == 200


@pytest.mark.parametrize("hint", ["9999999999", "Fri, 31 Dec 9999 23:59:59 GMT"])
def test_a_hint_of_centuries_gives_up_without_a_budget(clock: FakeClock, hint: str) -> None:
    """Without max_time, a server asking for more than a day is not waited for (nor can
    it make the sync transport's sleep overflow): its response comes back."""
    recorder = Recorder(answer(429, retry_after=hint), answer(200))
    transport = retrying(recorder, clock, policy=RetryPolicy(max_time=None))
    with httpx.Client(transport=transport) as client:
        assert client.get(URL).status_code == 429
    assert recorder.calls == 1
    assert clock.sleeps == []


def test_a_limiter_that_cannot_hold_a_token_is_refused() -> None:
    """Each attempt takes one token: a bucket of capacity 0.5 could never send one."""
    with pytest.raises(ValueError, match="capacity must be at least 1"):
        RetryTransport(limiter=TokenBucket(rate=1, capacity=0.5))


async def test_raise_on_give_up(clock: FakeClock) -> None:
    """With raise_on_give_up, giving up raises RetriesExhausted with the closed response."""
    recorder = Recorder(answer(429, retry_after="120"))
    policy = RetryPolicy(max_time=60.0, raise_on_give_up=True)
    async with httpx.AsyncClient(transport=retrying(recorder, clock, policy=policy)) as client:
        with pytest.raises(RetriesExhausted, match=r"max_time.*last status 429") as caught:
            await client.get(URL)
    assert caught.value.reason == "max_time"
    assert caught.value.response.status_code == 429
    assert caught.value.response.is_closed
    assert isinstance(caught.value, httpx.HTTPError)
    assert "secret" not in str(caught.value)


def test_raise_on_give_up_sync_after_max_retries(clock: FakeClock) -> None:
    """The sync side raises too, naming max_retries."""
    recorder = Recorder(answer(502))
    policy = RetryPolicy(max_retries=1, raise_on_give_up=True)
    with (
        httpx.Client(transport=retrying(recorder, clock, policy=policy)) as client,
        pytest.raises(RetriesExhausted) as caught,
    ):
        client.get(URL)
    assert caught.value.reason == "max_retries"
    assert recorder.sent[-1].is_closed


async def test_past_date_retries_now(clock: FakeClock) -> None:
    """A Retry-After date already passed means no wait."""
    recorder = Recorder(answer(503, retry_after="Fri, 01 May 2026 11:00:00 GMT"), answer(200))
    async with httpx.AsyncClient(transport=retrying(recorder, clock)) as client:
        assert (await client.get(URL)).status_code == 200
    assert clock.sleeps == [0.0]


async def test_date_hint_uses_the_wall_clock(clock: FakeClock) -> None:
    """A Retry-After date is measured against the injected wall clock."""
    recorder = Recorder(answer(503, retry_after="Fri, 01 May 2026 12:00:45 GMT"), answer(200))
    async with httpx.AsyncClient(transport=retrying(recorder, clock)) as client:
        assert (await client.get(URL)).status_code == 200
    assert clock.sleeps == [45.0]


async def test_garbage_hint_falls_back_to_backoff(
    clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    """A garbage Retry-After is logged and the backoff wait is used."""
    recorder = Recorder(answer(429, retry_after="1m0s"), answer(200))
    with caplog.at_level(logging.WARNING, logger="ratelimit_mw.client"):
        async with httpx.AsyncClient(transport=retrying(recorder, clock)) as client:
            assert (await client.get(URL)).status_code == 200
    assert clock.sleeps == [0.25]
    assert "1m0s" in caplog.text


async def test_github_reset_used_without_retry_after(clock: FakeClock) -> None:
    """GitHub's epoch reset is the hint when Retry-After is absent."""
    reset = str(int(WALL_NOW) + 30)
    recorder = Recorder(
        answer(429, x_ratelimit_remaining="0", x_ratelimit_reset=reset), answer(200)
    )
    async with httpx.AsyncClient(transport=retrying(recorder, clock)) as client:
        assert (await client.get(URL)).status_code == 200
    assert clock.sleeps == [30.0]


async def test_retry_after_wins_over_ratelimit(clock: FakeClock) -> None:
    """When both are present, Retry-After decides the wait."""
    recorder = Recorder(answer(429, retry_after="5", ratelimit='"q";r=0;t=50'), answer(200))
    async with httpx.AsyncClient(transport=retrying(recorder, clock)) as client:
        await client.get(URL)
    assert clock.sleeps == [5.0]


async def test_ietf_ratelimit_hint(clock: FakeClock) -> None:
    """The draft-11 RateLimit t= parameter is a hint."""
    recorder = Recorder(answer(429, ratelimit='"burst";r=0;t=7'), answer(200))
    async with httpx.AsyncClient(transport=retrying(recorder, clock)) as client:
        await client.get(URL)
    assert clock.sleeps == [7.0]


async def test_custom_duration_hint(clock: FakeClock) -> None:
    """A pluggable parser reads another provider's duration header."""
    recorder = Recorder(answer(429, x_reset_after="9"), answer(200))
    policy = RetryPolicy(hints=(duration_hint("x-reset-after"),))
    async with httpx.AsyncClient(transport=retrying(recorder, clock, policy=policy)) as client:
        await client.get(URL)
    assert clock.sleeps == [9.0]


@pytest.mark.parametrize("method", ["GET", "HEAD", "OPTIONS", "PUT", "DELETE"])
async def test_replay_safe_methods_are_retried(clock: FakeClock, method: str) -> None:
    """Idempotent methods are retried."""
    recorder = Recorder(answer(503), answer(200))
    async with httpx.AsyncClient(transport=retrying(recorder, clock)) as client:
        assert (await client.request(method, URL)).status_code == 200
    assert recorder.calls == 2


@pytest.mark.parametrize("method", ["POST", "PATCH"])
async def test_unsafe_methods_without_key_are_not_retried(clock: FakeClock, method: str) -> None:
    """POST and PATCH without an Idempotency-Key get one attempt."""
    recorder = Recorder(answer(503), answer(200))
    async with httpx.AsyncClient(transport=retrying(recorder, clock)) as client:
        assert (await client.request(method, URL, json={"a": 1})).status_code == 503
    assert recorder.calls == 1
    assert clock.sleeps == []


async def test_unsafe_method_connection_error_without_key_is_raised(clock: FakeClock) -> None:
    """A POST without a key is not replayed after a connection error either."""
    recorder = Recorder(httpx.ReadError("reset"), answer(200))
    async with httpx.AsyncClient(transport=retrying(recorder, clock)) as client:
        with pytest.raises(httpx.ReadError):
            await client.post(URL, json={"a": 1})
    assert recorder.calls == 1


@pytest.mark.parametrize("error", [
    httpx.ConnectError("refused"), httpx.ConnectTimeout("slow"), httpx.PoolTimeout("busy")])
async def test_a_post_that_was_never_sent_is_tried_again(
    clock: FakeClock, error: httpx.TransportError,
) -> None:
    """A connection that could not be made sent nothing: trying again replays nothing,
    so a POST without a key is retried after it (with the same body)."""
    recorder = Recorder(error, answer(201))
    async with httpx.AsyncClient(transport=retrying(recorder, clock)) as client:
        response = await client.post(URL, json={"a": 1})
    assert response.status_code == 201
    assert recorder.calls == 2
    assert [json.loads(body) for body in recorder.bodies] == [{"a": 1}, {"a": 1}]


def test_a_post_whose_body_cannot_be_sent_again_is_not_retried(clock: FakeClock) -> None:
    """...unless its body is a stream that was already consumed."""
    recorder = Recorder(httpx.ConnectError("refused"), answer(201))
    with httpx.Client(transport=retrying(recorder, clock)) as client, \
            pytest.raises(httpx.ConnectError):
        client.post(URL, content=iter([b"chunk"]))
    assert recorder.calls == 1


@pytest.mark.parametrize("method", ["POST", "PATCH"])
async def test_unsafe_methods_with_key_are_retried_with_the_same_key(
    clock: FakeClock, method: str
) -> None:
    """With an Idempotency-Key, POST and PATCH are retried, key and body unchanged."""
    recorder = Recorder(answer(503), answer(429), answer(201))
    async with httpx.AsyncClient(transport=retrying(recorder, clock)) as client:
        response = await client.request(
            method, URL, content=b"payload", headers={"Idempotency-Key": "k-1"}
        )
    assert response.status_code == 201
    assert [r.headers["idempotency-key"] for r in recorder.requests] == ["k-1"] * 3
    assert recorder.bodies == [b"payload"] * 3


@pytest.mark.parametrize("key", ["", "   ", "k" * 256])
async def test_a_key_no_server_honours_is_no_key(clock: FakeClock, key: str) -> None:
    """A blank Idempotency-Key (or one over 255 characters) gets a 400 or is ignored:
    the POST is not sent again on its strength."""
    recorder = Recorder(answer(503), answer(201))
    async with httpx.AsyncClient(transport=retrying(recorder, clock)) as client:
        response = await client.post(URL, content=b"x", headers={"Idempotency-Key": key})
    assert response.status_code == 503
    assert recorder.calls == 1


async def test_added_key_replaces_a_blank_one(clock: FakeClock) -> None:
    """add_idempotency_key gives a POST sent with a blank key one of its own."""
    recorder = Recorder(answer(503), answer(201))
    policy = RetryPolicy(add_idempotency_key=True)
    async with httpx.AsyncClient(transport=retrying(recorder, clock, policy=policy)) as client:
        response = await client.post(URL, content=b"x", headers={"Idempotency-Key": " "})
    assert response.status_code == 201
    keys = [r.headers["idempotency-key"] for r in recorder.requests]
    assert len(keys) == 2 and keys[0] == keys[1]
    uuid.UUID(keys[0])


async def test_added_idempotency_key_is_reused(clock: FakeClock) -> None:
    """add_idempotency_key gives a POST one fresh key, sent on every attempt."""
    recorder = Recorder(answer(503), answer(503), answer(200))
    policy = RetryPolicy(add_idempotency_key=True)
    async with httpx.AsyncClient(transport=retrying(recorder, clock, policy=policy)) as client:
        assert (await client.post(URL, json={"a": 1})).status_code == 200
    keys = {r.headers["idempotency-key"] for r in recorder.requests}
    assert len(keys) == 1
    assert recorder.calls == 3
    uuid.UUID(keys.pop())


async def test_added_key_keeps_a_callers_key(clock: FakeClock) -> None:
    """add_idempotency_key never replaces the caller's own key."""
    recorder = Recorder(answer(503), answer(200))
    policy = RetryPolicy(add_idempotency_key=True)
    async with httpx.AsyncClient(transport=retrying(recorder, clock, policy=policy)) as client:
        await client.post(URL, headers={"Idempotency-Key": "mine"})
    assert [r.headers["idempotency-key"] for r in recorder.requests] == ["mine", "mine"]


async def test_no_key_is_added_to_safe_methods(clock: FakeClock) -> None:
    """GET needs no key, so none is added."""
    recorder = Recorder(answer(200))
    policy = RetryPolicy(add_idempotency_key=True)
    async with httpx.AsyncClient(transport=retrying(recorder, clock, policy=policy)) as client:
        await client.get(URL)
    assert "idempotency-key" not in recorder.requests[0].headers


async def _chunks() -> AsyncIterator[bytes]:
    yield b"pay"
    yield b"load"


def _sync_chunks() -> Iterator[bytes]:
    yield b"pay"
    yield b"load"


async def test_streamed_body_is_not_replayed(clock: FakeClock) -> None:
    """A streamed body cannot be sent twice, so the request gets one attempt."""
    recorder = Recorder(answer(503), answer(200))
    async with httpx.AsyncClient(transport=retrying(recorder, clock)) as client:
        response = await client.put(URL, content=_chunks())
    assert response.status_code == 503
    assert recorder.calls == 1


async def test_buffered_streamed_body_is_replayed(clock: FakeClock) -> None:
    """With buffer_body, a streamed body is read once and replayed whole."""
    recorder = Recorder(answer(503), answer(200))
    policy = RetryPolicy(buffer_body=True)
    async with httpx.AsyncClient(transport=retrying(recorder, clock, policy=policy)) as client:
        assert (await client.put(URL, content=_chunks())).status_code == 200
    assert recorder.bodies == [b"payload", b"payload"]


def test_sync_streamed_body(clock: FakeClock) -> None:
    """The sync side applies the same rule, and buffers on request."""
    recorder = Recorder(answer(503), answer(200))
    with httpx.Client(transport=retrying(recorder, clock)) as client:
        assert client.put(URL, content=_sync_chunks()).status_code == 503
        once = {"retry": {"buffer_body": True}}
        assert client.put(URL, content=_sync_chunks(), extensions=once).status_code == 200


class TrackedStream(httpx.SyncByteStream, httpx.AsyncByteStream):
    """A response body that remembers whether it was closed."""

    def __init__(self) -> None:
        self.closed = False

    def __iter__(self) -> Iterator[bytes]:
        yield b"body"

    async def __aiter__(self) -> AsyncIterator[bytes]:
        yield b"body"

    def close(self) -> None:
        self.closed = True

    async def aclose(self) -> None:
        self.closed = True


def tracked(statuses: list[int]) -> tuple[httpx.MockTransport, list[TrackedStream]]:
    """A mock transport answering ``statuses`` in turn with bodies that record closing."""
    streams: list[TrackedStream] = []

    def handler(request: httpx.Request) -> httpx.Response:
        stream = TrackedStream()
        streams.append(stream)
        return httpx.Response(statuses[len(streams) - 1], stream=stream)

    return httpx.MockTransport(handler), streams


async def test_discarded_responses_are_closed_async(clock: FakeClock) -> None:
    """Every response that is not returned is closed before the next attempt."""
    mock, streams = tracked([503, 429, 500, 200])
    transport = RetryTransport(mock, clock=clock, async_sleep=clock.auto_sleep)
    async with (
        httpx.AsyncClient(transport=transport) as client,
        client.stream("GET", URL) as response,
    ):
        assert response.status_code == 200
        assert [s.closed for s in streams] == [True, True, True, False]
    assert streams[-1].closed


def test_discarded_responses_are_closed_sync(clock: FakeClock) -> None:
    """The sync side closes discarded responses too."""
    mock, streams = tracked([503, 504, 200])
    transport = RetryTransport(mock, clock=clock, sleep=clock.sleep)
    with httpx.Client(transport=transport) as client, client.stream("GET", URL) as response:
        assert response.status_code == 200
        assert [s.closed for s in streams] == [True, True, False]


async def test_each_retry_is_logged_without_the_query(
    clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    """A retry log names attempt, wait, status or error, method and the URL minus its query."""
    recorder = Recorder(answer(429, retry_after="2"), httpx.ConnectError("refused"), answer(200))
    with caplog.at_level(logging.INFO, logger="ratelimit_mw.client"):
        async with httpx.AsyncClient(transport=retrying(recorder, clock)) as client:
            await client.get("https://user:pw@api.example.org/items?token=secret#frag")
    first, second = (r for r in caplog.records if r.levelno == logging.INFO)
    assert first.name == "ratelimit_mw.client"
    assert (first.attempt, first.wait, first.method) == (1, 2.0, "GET")  # type: ignore[attr-defined]
    assert first.url == "https://api.example.org/items"  # type: ignore[attr-defined]
    assert "status 429" in first.getMessage()
    assert "ConnectError: refused" in second.getMessage()
    assert second.attempt == 2  # type: ignore[attr-defined]
    assert "secret" not in caplog.text
    assert "pw" not in caplog.text


async def test_per_request_override(clock: FakeClock) -> None:
    """extensions={'retry': {...}} changes the settings for one request."""
    recorder = Recorder(answer(503))
    async with httpx.AsyncClient(transport=retrying(recorder, clock)) as client:
        await client.get(URL, extensions={"retry": {"max_retries": 0}})
        assert recorder.calls == 1
        await client.get(URL, extensions={"retry": {"max_retries": 1}})
        assert recorder.calls == 3


async def test_retry_budget_stops_retries_across_calls(clock: FakeClock) -> None:
    """A shared retry budget stops retrying once half its tokens are spent."""
    recorder = Recorder(answer(503))
    budget = RetryBudget(max_tokens=4, token_ratio=1)
    transport = retrying(recorder, clock, retry_budget=budget)
    async with httpx.AsyncClient(transport=transport) as client:
        await client.get(URL)  # 4 -> 3 (retry) -> 2 (stop)
        assert recorder.calls == 2
        await client.get(URL)  # 2 -> 1, no retry
        assert recorder.calls == 3
        recorder.responses = [answer(200)]
        await client.get(URL)  # each success earns 1 token: 2
        await client.get(URL)  # 3
        recorder.responses = [answer(503), answer(200)]
        assert (await client.get(URL)).status_code == 503  # 3 -> 2: no retry at half
        recorder.responses = [answer(200)]
        await client.get(URL)  # 3
        await client.get(URL)  # 4
        recorder.responses = [answer(503), answer(200)]
        assert (await client.get(URL)).status_code == 200  # 4 -> 3, retried, success: 4
    assert budget.tokens == 4


async def test_retry_budget_shared_by_sync_and_async(clock: FakeClock) -> None:
    """One budget can back several transports."""
    budget = RetryBudget(max_tokens=2, token_ratio=0.1)
    failing = Recorder(answer(500))
    with httpx.Client(transport=retrying(failing, clock, retry_budget=budget)) as client:
        client.get(URL)
    other = Recorder(answer(500), answer(200))
    async with httpx.AsyncClient(transport=retrying(other, clock, retry_budget=budget)) as client:
        assert (await client.get(URL)).status_code == 500
    assert other.calls == 1


async def test_limiter_paces_every_attempt(clock: FakeClock) -> None:
    """A token bucket in the transport is paid once per attempt, retries included."""
    bucket = TokenBucket(rate=0.5, capacity=1, clock=clock, sleep=clock.auto_sleep)
    recorder = Recorder(answer(503, retry_after="0"), answer(200))
    transport = retrying(recorder, clock, limiter=bucket)
    async with httpx.AsyncClient(transport=transport) as client:
        assert (await client.get(URL)).status_code == 200
    assert clock.sleeps == [0.0, 2.0]  # the hint, then the bucket's refill


def test_limiter_sync(clock: FakeClock) -> None:
    """The sync side paces through acquire_sync."""
    bucket = TokenBucket(rate=1, capacity=1, clock=clock, sleep_sync=clock.sleep)
    recorder = Recorder(answer(200))
    with httpx.Client(transport=retrying(recorder, clock, limiter=bucket)) as client:
        client.get(URL)
        client.get(URL)
    assert clock.sleeps == [1.0]


async def test_adaptive_limiter_follows_server_quota(clock: FakeClock) -> None:
    """An adaptive bucket empties and pauses when the server says the quota is used up."""
    bucket = TokenBucket(rate=10, capacity=10, adaptive=True, clock=clock, sleep=clock.auto_sleep)
    recorder = Recorder(answer(200, ratelimit='"q";r=0;t=30'))
    async with httpx.AsyncClient(transport=retrying(recorder, clock, limiter=bucket)) as client:
        await client.get(URL)
        await client.get(URL)
    assert clock.sleeps == [pytest.approx(30.1)]


async def test_adaptive_limiter_pauses_on_429_hint(clock: FakeClock) -> None:
    """A 429's hint pauses the shared bucket for every caller."""
    bucket = TokenBucket(rate=10, capacity=10, adaptive=True, clock=clock, sleep=clock.auto_sleep)
    recorder = Recorder(answer(429, retry_after="4"), answer(200))
    async with httpx.AsyncClient(transport=retrying(recorder, clock, limiter=bucket)) as client:
        assert (await client.get(URL)).status_code == 200
    # 4 s hint, then the bucket, paused 4 s and empty, needs 0.1 s more for a token.
    assert clock.sleeps == [4.0, pytest.approx(0.1)]


async def test_testing_mode_makes_waits_instant(clock: FakeClock) -> None:
    """set_testing(True) skips every wait but still retries."""
    set_testing(True)
    recorder = Recorder(answer(429, retry_after="30"), answer(503), answer(200))
    bucket = TokenBucket(rate=0.001, capacity=1, clock=clock, sleep=clock.auto_sleep)
    policy = RetryPolicy(max_time=60.0)
    transport = retrying(recorder, clock, policy=policy, limiter=bucket)
    async with httpx.AsyncClient(transport=transport) as client:
        assert (await client.get(URL)).status_code == 200
    assert recorder.calls == 3
    assert clock.sleeps == []


@pytest.mark.parametrize("testing", [False, True])
async def test_testing_mode_decides_as_without_it(clock: FakeClock, testing: bool) -> None:
    """Testing mode skips the sleeping, not the decisions: a wait that would not fit
    max_time is given up on either way, and skipped waits count against it as waited."""
    set_testing(testing)
    policy = RetryPolicy(max_time=60.0, max_retries=5)
    recorder = Recorder(answer(429, retry_after="120"), answer(200))
    async with httpx.AsyncClient(transport=retrying(recorder, clock, policy=policy)) as client:
        assert (await client.get(URL)).status_code == 429
    assert recorder.calls == 1
    # Two waits of 25 s fit in 60 s; a third does not, slept or skipped.
    recorder = Recorder(*[answer(429, retry_after="25")] * 4)
    async with httpx.AsyncClient(transport=retrying(recorder, clock, policy=policy)) as client:
        assert (await client.get(URL)).status_code == 429
    assert recorder.calls == 3
    assert clock.sleeps == ([] if testing else [25.0, 25.0])


def test_testing_mode_sync(clock: FakeClock) -> None:
    """The sync side honours the testing switch too."""
    set_testing(True)
    recorder = Recorder(answer(503), answer(200))
    with httpx.Client(transport=retrying(recorder, clock)) as client:
        assert client.get(URL).status_code == 200
    assert clock.sleeps == []


async def test_sync_transport_in_async_client_is_a_clear_error() -> None:
    """Wrapping a sync-only transport and using it async says what to do."""
    transport = RetryTransport(httpx.HTTPTransport())
    async with httpx.AsyncClient(transport=transport) as client:
        with pytest.raises(TypeError, match="HTTPTransport is not an async transport"):
            await client.get(URL)
    transport.close()


def test_async_transport_in_sync_client_is_a_clear_error() -> None:
    """Wrapping an async-only transport and using it sync says what to do."""
    with (
        httpx.Client(transport=RetryTransport(httpx.AsyncHTTPTransport())) as client,
        pytest.raises(TypeError, match="AsyncHTTPTransport is not a sync transport"),
    ):
        client.get(URL)


def test_function_form(clock: FakeClock) -> None:
    """request() sends one request with retries and returns the read response."""
    recorder = Recorder(answer(503, retry_after="0"), answer(200))
    response = request("GET", URL, transport=httpx.MockTransport(recorder))
    assert response.status_code == 200
    assert response.content == b"body"
    assert recorder.calls == 2


async def test_async_function_form() -> None:
    """arequest() is the async twin of request()."""
    recorder = Recorder(answer(503, retry_after="0"), answer(200))
    response = await arequest(
        "GET", URL, transport=httpx.MockTransport(recorder), policy=RetryPolicy(max_retries=0)
    )
    assert response.status_code == 503
    assert recorder.calls == 1


async def test_broken_custom_hint_parser_is_logged_and_skipped(
    clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    """A custom hint parser that raises or answers nonsense is skipped; the next one decides."""

    def broken(headers: httpx.Headers, now: float) -> float | None:
        raise KeyError("oops")

    def negative(headers: httpx.Headers, now: float) -> float | None:
        return -5.0

    recorder = Recorder(answer(429, retry_after="6"), answer(200))
    policy = RetryPolicy(hints=(broken, negative, *DEFAULT_HINTS))
    with caplog.at_level(logging.ERROR, logger="ratelimit_mw.client"):
        async with httpx.AsyncClient(transport=retrying(recorder, clock, policy=policy)) as client:
            assert (await client.get(URL)).status_code == 200
    assert clock.sleeps == [6.0]
    assert "hint parser" in caplog.text
    assert all(r.is_closed for r in recorder.sent[:-1])


@pytest.mark.parametrize("sync", [False, True])
async def test_the_limiter_is_waited_for_within_the_budget_only(
        clock: FakeClock, sync: bool) -> None:
    """Callers that queue in the limiter while a retry sleeps cannot push it past
    max_time: the retry gives up when its turn would come too late and hands back the
    last response, read and whole."""
    limiter = TokenBucket(rate=1, capacity=1, clock=clock, sleep=clock.auto_sleep,
                          sleep_sync=clock.sleep)
    policy = RetryPolicy(max_time=3.0)
    queued: list[bool] = []

    def others_queue(seconds: float) -> None:
        # Five tokens spoken for while the retry sleeps: its turn is 5 s away.
        clock.sleep(seconds)
        limiter._tokens = 0.0
        limiter._waiters.extend(_waiter(1) for _ in range(5))
        queued.append(True)

    async def others_queue_async(seconds: float) -> None:
        others_queue(seconds)

    recorder = Recorder(answer(503, retry_after="1"), answer(200))
    transport = retrying(recorder, clock, policy=policy, limiter=limiter, sleep=others_queue,
                         async_sleep=others_queue_async)
    response = await get_with(transport, sync=sync)
    assert queued == [True]
    assert response.status_code == 503
    assert response.content == b"body"
    assert recorder.calls == 1
    assert clock.now - 1000.0 <= 3.0
    assert limiter.waiting == 5  # it left the queue


def _waiter(n: float) -> object:
    from ratelimit_mw.client.bucket import _Waiter

    return _Waiter(n, lambda: None)


@pytest.mark.parametrize("sync", [False, True])
async def test_a_first_attempt_the_limiter_cannot_serve_in_time_is_not_sent(
        clock: FakeClock, sync: bool) -> None:
    """Before the first attempt too, the limiter is waited for only within max_time:
    beyond it, LimiterTimeout (a TimeoutException) comes at once, and nothing is sent."""
    limiter = TokenBucket(rate=0.1, capacity=1, clock=clock, sleep=clock.auto_sleep,
                          sleep_sync=clock.sleep)
    recorder = Recorder(answer(200))
    transport = retrying(recorder, clock, policy=RetryPolicy(max_time=5.0), limiter=limiter)
    with httpx.Client(transport=transport) as client:
        assert client.get(URL).status_code == 200  # the token there
    with pytest.raises(LimiterTimeout, match=r"not sent: the limiter had no token within max_time"):
        if sync:
            with httpx.Client(transport=transport) as client:
                client.get(URL)
        else:
            async with httpx.AsyncClient(transport=transport) as client:
                await client.get(URL)
    assert issubclass(LimiterTimeout, httpx.TimeoutException)
    assert recorder.calls == 1
    assert clock.sleeps == []  # a 10 s wait in a 5 s budget is not started
    roomy = retrying(recorder, clock, policy=RetryPolicy(max_time=20.0), limiter=limiter)
    async with httpx.AsyncClient(transport=roomy) as client:
        assert (await client.get(URL)).status_code == 200
    assert clock.sleeps == [pytest.approx(10.0)]


@pytest.mark.parametrize("reset", ["retry-after", "ratelimit-reset"])
async def test_a_reset_centuries_away_does_not_freeze_the_limiter(
        clock: FakeClock, reset: str) -> None:
    """A Retry-After of centuries (given up on) or an epoch sent as a draft-6 duration
    does not pause an adaptive limiter for years: the next request goes at once."""
    limiter = TokenBucket(rate=10, capacity=10, adaptive=True, clock=clock,
                          sleep=clock.auto_sleep)
    headers = ({"retry_after": "9999999999"} if reset == "retry-after"
               else {"ratelimit_remaining": "0", "ratelimit_reset": str(int(WALL_NOW) + 60)})
    recorder = Recorder(answer(429 if reset == "retry-after" else 200, **headers), answer(200))
    transport = retrying(recorder, clock, policy=RetryPolicy(max_time=2.0), limiter=limiter)
    async with httpx.AsyncClient(transport=transport) as client:
        await client.get(URL)
        assert (await client.get(URL)).status_code == 200
    assert recorder.calls == 2
    assert clock.now - 1000.0 < 1.0


async def test_retry_after_wins_over_the_quota_reset_in_an_adaptive_limiter(
        clock: FakeClock) -> None:
    """A 429 saying Retry-After: 1 and RateLimit t=30 is retried after 1 s, with an
    adaptive limiter as without one."""
    limiter = TokenBucket(rate=10, capacity=10, adaptive=True, clock=clock,
                          sleep=clock.auto_sleep)
    recorder = Recorder(answer(429, retry_after="1", ratelimit='"burst";r=0;t=30'),
                        answer(200))
    transport = retrying(recorder, clock, policy=RetryPolicy(max_time=10.0), limiter=limiter)
    async with httpx.AsyncClient(transport=transport) as client:
        assert (await client.get(URL)).status_code == 200
    assert recorder.calls == 2
    assert sum(clock.sleeps) == pytest.approx(1.1)  # the hint, then 0.1 s for a token


async def test_a_body_that_fails_to_read_is_raised_if_the_limiter_gives_up(
        clock: FakeClock) -> None:
    """The last response is read before its wait so that it can be handed back; if
    reading it fails, that error is what a limiter that gives up raises."""

    class Broken(httpx.AsyncByteStream):
        async def __aiter__(self) -> AsyncIterator[bytes]:
            raise httpx.ReadError("connection reset")
            yield b""

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(503, headers={"retry-after": "1"}, stream=Broken())

    limiter = TokenBucket(rate=1, capacity=1, clock=clock, sleep=clock.auto_sleep)

    async def others_queue(seconds: float) -> None:
        clock.sleep(seconds)
        limiter._waiters.extend(_waiter(1) for _ in range(5))

    transport = RetryTransport(httpx.MockTransport(handler), policy=RetryPolicy(max_time=5.0),
                               limiter=limiter, clock=clock, async_sleep=others_queue)
    async with httpx.AsyncClient(transport=transport) as client:
        with pytest.raises(httpx.ReadError, match="connection reset"):
            await client.get(URL)
    assert clock.sleeps == [1.0]
    assert limiter.waiting == 5

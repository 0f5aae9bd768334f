"""The client side serves httpx2 and httpx alike, installed side by side as here.

The rest of tests/client drives httpx; the last test runs that whole directory again with
``import httpx`` made httpx2 (``httpx2.alias_httpx()``), as a project on httpx2 alone has it.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import httpx
import httpx2
import pytest

from ratelimit_mw.breaker import CircuitBreaker, CircuitState
from ratelimit_mw.client import (
    CircuitOpenTransportError,
    LimiterTimeout,
    RetriesExhausted,
    RetryPolicy,
    RetryTransport,
    TokenBucket,
    arequest,
    request,
    set_testing,
)
from tests.client.test_live_server import LiveServer, seconds

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(params=["httpx", "httpx2"])
def library(request: pytest.FixtureRequest) -> ModuleType:
    """The HTTP library the client under test is built on."""
    return {"httpx": httpx, "httpx2": httpx2}[request.param]


@pytest.fixture(autouse=True)
def _instant_waits() -> Iterator[None]:
    """Back-off waits are skipped (conftest's ``_testing_off`` switches it off after)."""
    set_testing(True)
    yield


def _replies(library: ModuleType, *statuses: int) -> tuple[object, list[bytes]]:
    """A mock transport of ``library`` answering ``statuses`` in turn (then 200), and the
    bodies of the requests it saw."""
    answers = iter(statuses)
    bodies: list[bytes] = []

    def answer(req: httpx.Request) -> httpx.Response:
        bodies.append(req.content)
        return library.Response(next(answers, 200), headers={"Retry-After": "0"})

    return library.MockTransport(answer), bodies


async def test_an_async_client_of_either_library_is_retried(library: ModuleType) -> None:
    """A 429 then a 200, through an AsyncClient of the library: the 200 comes back."""
    api, bodies = _replies(library, 429)
    async with library.AsyncClient(transport=RetryTransport(api)) as client:
        response = await client.get("https://api.example.org/items")
    assert (response.status_code, len(bodies)) == (200, 2)
    assert isinstance(response, library.Response)


def test_a_sync_client_of_either_library_is_retried(library: ModuleType) -> None:
    """A 503 then a 200, through a Client of the library: the 200 comes back."""
    api, bodies = _replies(library, 503)
    with library.Client(transport=RetryTransport(api)) as client:
        response = client.get("https://api.example.org/items")
    assert (response.status_code, len(bodies)) == (200, 2)


async def test_a_post_body_of_either_library_is_sent_again(library: ModuleType) -> None:
    """A POST with an Idempotency-Key is replayed with its whole body: the library's
    in-memory stream is recognised as one."""
    api, bodies = _replies(library, 503)
    async with library.AsyncClient(transport=RetryTransport(api)) as client:
        response = await client.post("https://api.example.org/orders", content=b"one order",
                                     headers={"Idempotency-Key": "order-1"})
    assert response.status_code == 200
    assert bodies == [b"one order", b"one order"]


async def test_a_connection_error_of_either_library_is_retried(library: ModuleType) -> None:
    """The library's own ConnectError counts as a connection error worth a retry."""
    calls: list[int] = []

    def flaky(req: httpx.Request) -> httpx.Response:
        calls.append(1)
        if len(calls) == 1:
            raise library.ConnectError("refused", request=req)
        return library.Response(200)

    transport = RetryTransport(library.MockTransport(flaky))
    async with library.AsyncClient(transport=transport) as client:
        response = await client.get("https://api.example.org/items")
    assert (response.status_code, len(calls)) == (200, 2)


async def test_giving_up_raises_an_http_error_of_both_libraries(library: ModuleType) -> None:
    """RetriesExhausted is caught by ``except httpx.HTTPError`` and by httpx2's."""
    api, _ = _replies(library, 429, 429)
    policy = RetryPolicy(max_retries=1, raise_on_give_up=True)
    async with library.AsyncClient(transport=RetryTransport(api, policy=policy)) as client:
        with pytest.raises(RetriesExhausted) as caught:
            await client.get("https://api.example.org/items")
    assert isinstance(caught.value, httpx.HTTPError)
    assert isinstance(caught.value, httpx2.HTTPError)
    assert caught.value.request.url.path == "/items"
    assert caught.value.response.status_code == 429


async def test_a_limiter_timeout_is_a_timeout_of_both_libraries(library: ModuleType) -> None:
    """No token in time: LimiterTimeout is each library's TimeoutException."""
    set_testing(False)  # the limiter's wait would be skipped, and a token found
    limiter = TokenBucket(rate=0.001, capacity=1)
    assert await limiter.acquire()
    api, bodies = _replies(library)
    policy = RetryPolicy(max_time=0.01)
    async with library.AsyncClient(
            transport=RetryTransport(api, policy=policy, limiter=limiter)) as client:
        with pytest.raises(LimiterTimeout) as caught:
            await client.get("https://api.example.org/items")
    assert isinstance(caught.value, httpx.TimeoutException)
    assert isinstance(caught.value, httpx2.TimeoutException)
    assert caught.value.request.url.path == "/items"
    assert bodies == []


def test_an_open_breaker_raises_a_transport_error_of_both_libraries(library: ModuleType) -> None:
    """The breaker's refusal is each library's TransportError, and nothing is sent."""
    breaker = CircuitBreaker(name="api", window_size=1, minimum_calls=1, cooldown=60.0)
    breaker.acquire().record_failure()
    assert breaker.state is CircuitState.OPEN
    api, bodies = _replies(library)
    with (library.Client(transport=RetryTransport(api, breaker=breaker)) as client,
          pytest.raises(CircuitOpenTransportError) as caught):
        client.get("https://api.example.org/items")
    assert isinstance(caught.value, httpx.TransportError)
    assert isinstance(caught.value, httpx2.TransportError)
    assert bodies == []


async def test_the_default_transport_is_the_client_librarys(library: ModuleType) -> None:
    """Without a transport to wrap, a real request goes out through the HTTP transport of
    the client's own library."""
    with LiveServer({"/limited": [(429, seconds("0"))]}) as server:
        retrying = RetryTransport()
        async with library.AsyncClient(transport=retrying) as client:
            response = await client.get(f"{server.url}/limited")
        with library.Client(transport=retrying) as client:
            again = client.get(f"{server.url}/limited")
    assert (response.status_code, again.status_code) == (200, 200)
    assert len(server.hits["/limited"]) == 3
    assert isinstance(retrying._async_inner, library.AsyncHTTPTransport)
    assert isinstance(retrying._sync_inner, library.HTTPTransport)


async def test_one_off_calls_take_httpx2_unless_given_a_transport() -> None:
    """``request`` and ``arequest`` use httpx2 when it is installed, or the library of the
    transport they are given."""
    with LiveServer({}) as server:
        default = request("GET", f"{server.url}/a")
        given = request("GET", f"{server.url}/b", transport=httpx.HTTPTransport())
        async_default = await arequest("GET", f"{server.url}/c")
        async_given = await arequest("GET", f"{server.url}/d", transport=httpx.AsyncHTTPTransport())
    assert isinstance(default, httpx2.Response) and isinstance(async_default, httpx2.Response)
    if httpx is not httpx2:  # else httpx2.alias_httpx() made them one
        assert isinstance(given, httpx.Response) and not isinstance(given, httpx2.Response)
        assert not isinstance(async_given, httpx2.Response)
    assert {r.text for r in (default, given, async_default, async_given)} == {"ok"}


@pytest.mark.slow
def test_the_client_suite_passes_on_httpx2_alone() -> None:
    """tests/client, run again with ``import httpx`` giving httpx2: everything passes."""
    this = "tests/client/test_libraries.py::test_the_client_suite_passes_on_httpx2_alone"
    code = ("import httpx2; httpx2.alias_httpx()\n"
            "import sys, pytest\n"
            "sys.exit(pytest.main(sys.argv[1:]))\n")
    # httpx2 imports anyio, a pytest plugin, before pytest can rewrite its asserts.
    # test_install.py builds a venv of the [client] extra: the packaging, not the library.
    args = ["-q", "-p", "no:cacheprovider", "-m", "", "-W",
            "ignore::pytest.PytestAssertRewriteWarning", "tests/client", "--deselect", this,
            "--ignore", "tests/client/test_install.py"]
    run = subprocess.run([sys.executable, "-c", code, *args], cwd=ROOT, capture_output=True,
                         text=True, timeout=600, check=False)
    assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-3000:]
    assert " passed" in run.stdout and "failed" not in run.stdout

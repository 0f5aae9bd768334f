"""The transport against a real HTTP server on 127.0.0.1: real sockets, real waits."""

from __future__ import annotations

import email.utils
import logging
import socket
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest

from ratelimit_mw.client import RetryPolicy, RetryTransport, request

# Each path answers with these (status, Retry-After) in turn, then 200.
Script = dict[str, list[tuple[int, Callable[[], str]]]]


class LiveServer:
    """A tiny threaded HTTP/1.1 server that plays a script per path and counts requests."""

    def __init__(self, script: Script) -> None:
        self.script = {path: list(steps) for path, steps in script.items()}
        self.hits: dict[str, list[float]] = {}
        self._lock = threading.Lock()
        live = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:
                path = self.path.split("?")[0]
                with live._lock:
                    live.hits.setdefault(path, []).append(time.monotonic())
                    steps = live.script.get(path, [])
                    status, retry_after = steps.pop(0) if steps else (200, lambda: "")
                body = b"ok" if status == 200 else b"slow down"
                self.send_response(status)
                for value in retry_after().split("\n"):  # a line each
                    if value:
                        self.send_header("Retry-After", value)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:
                """Keep the test output quiet."""

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        host, port = self.server.server_address[:2]
        self.url = f"http://{host!s}:{port}"
        self._thread = threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )

    def __enter__(self) -> LiveServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
        self._thread.join(timeout=5)


def seconds(value: str) -> Callable[[], str]:
    """A Retry-After value fixed in advance."""
    return lambda: value


def date_in(delta: float) -> Callable[[], str]:
    """A Retry-After HTTP-date ``delta`` seconds after the moment it is sent."""
    return lambda: email.utils.formatdate(time.time() + delta, usegmt=True)


@pytest.fixture
def server() -> Iterator[LiveServer]:
    """A live server: /limited says 429 with Retry-After: 1 once, /date uses an HTTP-date."""
    script: Script = {
        "/limited": [(429, seconds("1"))],
        "/sync": [(503, seconds("1"))],
        "/date": [(429, date_in(2))],
        "/long": [(429, seconds("30"))],
        "/twice": [(429, seconds("1\n2"))],
    }
    with LiveServer(script) as live:
        yield live


@pytest.mark.slow
async def test_async_client_waits_for_retry_after(server: LiveServer) -> None:
    """A real 429 with Retry-After: 1 is retried no sooner than 1 s later."""
    async with httpx.AsyncClient(transport=RetryTransport()) as client:
        started = time.monotonic()
        response = await client.get(f"{server.url}/limited?key=secret")
        elapsed = time.monotonic() - started
    assert response.status_code == 200
    assert response.text == "ok"
    first, second = server.hits["/limited"]
    assert second - first >= 1.0
    assert 1.0 <= elapsed < 5.0


@pytest.mark.slow
def test_sync_client_waits_for_retry_after(server: LiveServer) -> None:
    """The sync client waits just the same, and the function form works on a real socket."""
    started = time.monotonic()
    response = request("GET", f"{server.url}/sync")
    assert response.status_code == 200
    first, second = server.hits["/sync"]
    assert second - first >= 1.0
    assert time.monotonic() - started >= 1.0


@pytest.mark.slow
async def test_a_repeated_retry_after_is_waited_for_in_full(server: LiveServer) -> None:
    """Two Retry-After lines (a proxy added one): the longer is waited for, not neither
    (httpx joins them to "1, 2", which used to be garbage, and back-off retried at once)."""
    async with httpx.AsyncClient(transport=RetryTransport()) as client:
        response = await client.get(f"{server.url}/twice")
    assert response.status_code == 200
    first, second = server.hits["/twice"]
    assert 2.0 <= second - first < 5.0


@pytest.mark.slow
async def test_http_date_retry_after(server: LiveServer) -> None:
    """A Retry-After HTTP-date two seconds ahead (whole seconds) is waited for, at least 1 s."""
    async with httpx.AsyncClient(transport=RetryTransport()) as client:
        response = await client.get(f"{server.url}/date")
    assert response.status_code == 200
    first, second = server.hits["/date"]
    assert 1.0 <= second - first < 5.0


async def test_hint_beyond_the_budget_returns_at_once(server: LiveServer) -> None:
    """Retry-After: 30 with a 5 s budget gives back the 429 now instead of sleeping."""
    transport = RetryTransport(policy=RetryPolicy(max_time=5.0))
    async with httpx.AsyncClient(transport=transport) as client:
        started = time.monotonic()
        response = await client.get(f"{server.url}/long")
        elapsed = time.monotonic() - started
    assert response.status_code == 429
    assert response.headers["retry-after"] == "30"
    assert len(server.hits["/long"]) == 1
    assert elapsed < 1.0


async def test_connection_refused_is_retried_then_raised(caplog: pytest.LogCaptureFixture) -> None:
    """A closed port is retried with backoff, then the ConnectError propagates."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    policy = RetryPolicy(max_retries=2, backoff_base=0.01, backoff_cap=0.05)
    with caplog.at_level(logging.INFO, logger="ratelimit_mw.client"):
        async with httpx.AsyncClient(transport=RetryTransport(policy=policy)) as client:
            with pytest.raises(httpx.ConnectError):
                await client.get(f"http://127.0.0.1:{port}/")
    retries = [r for r in caplog.records if r.levelno == logging.INFO]
    assert [r.attempt for r in retries] == [1, 2]  # type: ignore[attr-defined]

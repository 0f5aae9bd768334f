"""Processes for the reliability tests: uvicorn serving ``tests.reliability.app``, a
delaying TCP proxy, and a concurrent load that records every answer.

Every process started here is stopped by the context manager that started it, even
when the test fails; every wait polls with a deadline.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx
import redis as sync_redis
from redis.cluster import ClusterNode

from tests.conftest import free_port
from tests.redis_servers import StartupError

__all__ = [
    "ROOT",
    "DelayProxy",
    "RawHTTP",
    "Reply",
    "Request",
    "assert_keys_expire",
    "delete_prefix",
    "stop_group",
    "uvicorn_server",
]

ROOT = Path(__file__).resolve().parents[2]


@contextlib.contextmanager
def uvicorn_server(
    env: Mapping[str, str], *, workers: int = 1, app: str = "tests.reliability.app:app",
    timeout: float = 20.0,
) -> Iterator[str]:
    """``python -m uvicorn app --workers N`` on a free loopback port; yields its base URL.

    ``env`` is added to this process's environment. Waits until every worker has
    answered ``/health`` (told apart by ``x-worker-pid``); the whole process group is
    stopped on exit.
    """
    port = free_port()
    argv = [sys.executable, "-m", "uvicorn", app, "--host", "127.0.0.1", "--port", str(port),
            "--workers", str(workers), "--log-level", "warning", "--no-access-log",
            "--no-proxy-headers",  # forwarding headers are the middleware's business
            "--lifespan", "on", "--ws", "none"]
    with tempfile.TemporaryFile() as log:
        proc = subprocess.Popen(argv, cwd=ROOT, env={**os.environ, **env}, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)
        url = f"http://127.0.0.1:{port}"
        try:
            if not _workers_answer(proc, url, workers, timeout):
                log.seek(0)
                output = log.read().decode(errors="replace")[-4000:]
                msg = (f"uvicorn on {url} did not start {workers} worker(s) in {timeout} s "
                       f"(exit code {proc.poll()}):\n{output}")
                raise StartupError(msg)
            yield url
        finally:
            stop_group(proc)


def _workers_answer(proc: subprocess.Popen[bytes], url: str, workers: int,
                    timeout: float) -> bool:
    """Poll ``/health`` until ``workers`` distinct worker pids have answered."""
    pids: set[str] = set()
    deadline = time.monotonic() + timeout
    with httpx.Client(base_url=url, timeout=1.0) as client:
        while len(pids) < workers:
            if proc.poll() is not None or time.monotonic() > deadline:
                return False
            try:
                # A new connection each time, so the kernel may hand it to any worker.
                response = client.get("/health", headers={"connection": "close"})
                pids.add(response.headers["x-worker-pid"])
            except (httpx.HTTPError, KeyError):
                time.sleep(0.05)
    return True


def stop_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM a process group we started (a server and its workers); SIGKILL what lingers."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=10)
    # Workers of a master that died first would linger in the group: kill what is left.
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=10)


def _client(url: str) -> sync_redis.Redis | sync_redis.RedisCluster:
    """A synchronous client of ``redis://`` or ``redis+cluster://h:p,h:p``."""
    if url.startswith("redis+cluster://"):
        nodes = [ClusterNode(host, int(port))  # type: ignore[no-untyped-call]
                 for host, _, port in
                 (item.rpartition(":") for item in url.removeprefix("redis+cluster://")
                  .split("/")[0].split(","))]
        return sync_redis.RedisCluster(startup_nodes=nodes)
    return sync_redis.Redis.from_url(url)


def assert_keys_expire(url: str, prefix: str) -> int:
    """Every key under ``prefix`` has a TTL > 0 (nothing leaks); returns how many there are."""
    client = _client(url)
    try:
        names = list(client.scan_iter(match=f"{prefix}*", count=1000))
        ttls = {name: client.pttl(name) for name in names}
    finally:
        client.close()
    forever = {name: ttl for name, ttl in ttls.items() if not (isinstance(ttl, int) and ttl > 0)}
    assert not forever, f"keys without a TTL under {prefix!r}: {forever}"
    return len(names)


def delete_prefix(url: str, prefix: str) -> None:
    """Delete the keys under ``prefix`` (on a shared Redis)."""
    client = sync_redis.Redis.from_url(url)
    try:
        names = list(client.scan_iter(match=f"{prefix}*", count=1000))
        if names:
            client.delete(*names)
    finally:
        client.close()


Request = tuple[str, Mapping[str, str] | None]
"""A GET request of a load: its path and extra headers."""


@dataclass(frozen=True, slots=True)
class Reply:
    """One request of a load: when it was sent and answered (monotonic), and the answer."""

    sent: float
    done: float
    status: int  # 0: no HTTP answer (connection error, client timeout)
    headers: Mapping[str, str]  # lower-case names
    error: str = ""

    @property
    def latency(self) -> float:
        return self.done - self.sent


class RawHTTP:
    """A lean HTTP/1.1 keep-alive client for big bursts on loopback.

    httpx spends about 2 ms of CPU per request here, which on a 2-core machine makes
    the client, not the server, the bottleneck of a 10 000-request test. This one
    speaks just enough HTTP/1.1 (Content-Length and chunked bodies, keep-alive)."""

    def __init__(self, base_url: str, connections: int = 100, timeout: float = 20.0) -> None:
        host, _, port = base_url.removeprefix("http://").partition(":")
        self.host, self.port = host, int(port)
        self.connections = connections
        self.timeout = timeout

    async def burst(self, requests: Sequence[Request]) -> list[Reply]:
        """Send every ``(path, headers)`` over ``connections`` keep-alive connections; the
        replies in the order of ``requests``."""
        replies: dict[int, Reply] = {}
        await self.run(enumerate(requests), replies.__setitem__,
                       connections=min(self.connections, len(requests)))
        return [replies[i] for i in range(len(requests))]

    async def until(self, stop: asyncio.Event, request: Request, replies: list[Reply], *,
                    limit_s: float, pause: float = 0.01) -> None:
        """Repeat ``request`` on every connection (``pause`` between two on one connection)
        until ``stop`` is set or ``limit_s`` has passed; replies appended to ``replies``."""
        deadline = time.monotonic() + limit_s

        def forever() -> Iterator[tuple[int, Request]]:
            i = 0
            while not stop.is_set() and time.monotonic() < deadline:
                yield i, request
                i += 1

        await self.run(forever(), lambda _, reply: replies.append(reply), pause=pause)

    async def run(self, todo: Iterator[tuple[int, Request]],
                  record: Callable[[int, Reply], object], *, connections: int | None = None,
                  pause: float = 0.0) -> None:
        """Connections take the next request from ``todo`` until it is exhausted."""
        async def connection() -> None:
            reader: asyncio.StreamReader | None = None
            writer: asyncio.StreamWriter | None = None
            try:
                for i, (path, headers) in todo:
                    sent = time.monotonic()
                    try:
                        if reader is None or writer is None:
                            reader, writer = await asyncio.open_connection(self.host, self.port)
                        async with asyncio.timeout(self.timeout):
                            status, got = await self._exchange(reader, writer, path, headers)
                    except (OSError, asyncio.IncompleteReadError, TimeoutError, ValueError) as exc:
                        record(i, Reply(sent, time.monotonic(), 0, {}, repr(exc)))
                        if writer is not None:
                            writer.close()
                        reader = writer = None
                        continue
                    record(i, Reply(sent, time.monotonic(), status, got))
                    if got.get("connection", "").lower() == "close":
                        writer.close()
                        reader = writer = None
                    if pause:
                        await asyncio.sleep(pause)
            finally:
                if writer is not None:
                    writer.close()

        await asyncio.gather(*(connection() for _ in range(connections or self.connections)))

    async def _exchange(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                        path: str, headers: Mapping[str, str] | None) -> tuple[int, dict[str, str]]:
        lines = [f"GET {path} HTTP/1.1", f"host: {self.host}:{self.port}"]
        lines += [f"{name}: {value}" for name, value in (headers or {}).items()]
        writer.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"))
        head = await reader.readuntil(b"\r\n\r\n")
        status_line, *header_lines = head.decode("latin-1").split("\r\n")
        status = int(status_line.split(" ", 2)[1])
        got: dict[str, str] = {}
        for line in header_lines:
            if line:
                name, _, value = line.partition(":")
                got[name.strip().lower()] = value.strip()
        if "content-length" in got:
            await reader.readexactly(int(got["content-length"]))
        elif got.get("transfer-encoding", "").lower() == "chunked":
            while size := int((await reader.readuntil(b"\r\n")).split(b";")[0], 16):
                await reader.readexactly(size + 2)
            await reader.readuntil(b"\r\n")
        return status, got


class DelayProxy:
    """A TCP proxy on loopback that holds every chunk ``delay`` seconds in each direction."""

    def __init__(self, target_port: int, delay: float) -> None:
        self.target_port = target_port
        self.delay = delay
        self.port = 0
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Future[tuple[None, None]]] = set()

    async def __aenter__(self) -> DelayProxy:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        assert self._server is not None
        self._server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        upstream: asyncio.StreamWriter | None = None
        try:
            up_reader, upstream = await asyncio.open_connection("127.0.0.1", self.target_port)
        except OSError:
            writer.close()
            return
        # The pump, not this handler, is what __aexit__ cancels: asyncio's server logs a
        # cancelled handler as an error.
        pump = asyncio.ensure_future(asyncio.gather(self._pipe(reader, upstream),
                                                    self._pipe(up_reader, writer)))
        self._tasks.add(pump)
        try:
            await pump
        except (OSError, asyncio.IncompleteReadError, asyncio.CancelledError):
            pass
        finally:
            self._tasks.discard(pump)
            writer.close()
            upstream.close()

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Forward chunks in order, each ``delay`` after it arrived (latency, not throughput)."""
        queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

        async def deliver() -> None:
            while True:
                due, chunk = await queue.get()
                if not chunk:
                    if writer.can_write_eof():
                        writer.write_eof()
                    return
                await asyncio.sleep(max(0.0, due - time.monotonic()))
                writer.write(chunk)
                await writer.drain()

        delivery = asyncio.create_task(deliver())
        try:
            while True:
                chunk = await reader.read(65536)
                queue.put_nowait((time.monotonic() + self.delay, chunk))
                if not chunk:
                    break
            await delivery
        finally:
            delivery.cancel()
            with contextlib.suppress(asyncio.CancelledError, OSError):
                await delivery

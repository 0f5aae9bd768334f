"""A TCP proxy on loopback that puts network faults between the app and Redis.

Every slow-Redis test elsewhere slows the server (``DEBUG SLEEP``, ``SIGSTOP``); the
network fails otherwise. Through ``FaultProxy`` a test adds latency to the link, holds
it (nothing forwarded, both sockets open: a switch that drops packets), or resets the
connections in the middle of a reply, then clears the fault:

>>> with fault_proxy("127.0.0.1", redis_port) as proxy:   # doctest: +SKIP
...     storage = RedisStorage.from_url(proxy.url)
...     proxy.latency = 0.05      # 50 ms more per round trip
...     proxy.hold()              # the link stops forwarding
...     proxy.clear()             # everything forwarded again, held bytes first

``fault_proxy`` runs the proxy in a process of its own, so that a test's load, busy
in its own process, does not slow the link down as well.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from types import TracebackType

__all__ = ["FaultProxy", "ProxyProcess", "fault_proxy"]

_CHUNK = 65536


class FaultProxy:
    """Forwards loopback connections to ``host:port``, with the faults a test sets.

    ``latency``: seconds added to each round trip (half on the way to Redis, half on
    the way back), in order. ``hold()``: nothing is forwarded either way, new
    connections are accepted and left waiting, until ``clear()``. ``reset_mid_reply()``:
    the next chunk Redis sends is cut in half and every connection is reset (RST).
    """

    def __init__(self, host: str, port: int) -> None:
        self.host = host
        self.port = port
        self.latency = 0.0
        self._open = asyncio.Event()  # set while forwarding
        self._open.set()
        self._reset_next = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: asyncio.Server | None = None
        self._links: set[tuple[asyncio.StreamWriter, asyncio.StreamWriter]] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self.connections = 0
        """Connections accepted since the start."""
        self.resets = 0
        """Connections reset by ``reset_mid_reply``."""

    @property
    def url(self) -> str:
        """``redis://`` URL of the proxy (database 0)."""
        return f"redis://127.0.0.1:{self.listening_port}/0"

    @property
    def listening_port(self) -> int:
        assert self._server is not None, "start the proxy first"
        return int(self._server.sockets[0].getsockname()[1])

    def hold(self) -> None:
        """Stop forwarding; the sockets stay open, and what is sent waits."""
        self._on_loop(self._open.clear)

    def reset_mid_reply(self) -> None:
        """Cut the next chunk from Redis in half, then reset every connection."""
        self._reset_next = True

    def clear(self) -> None:
        """No more fault: no latency, forwarding again (held bytes first)."""
        self.latency = 0.0
        self._reset_next = False
        self._on_loop(self._open.set)

    def _on_loop(self, call: Callable[[], object]) -> None:
        """Run ``call`` on the proxy's loop (a test may run on another one)."""
        loop = self._loop
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if loop is None or loop is running:
            call()
        else:
            loop.call_soon_threadsafe(call)

    async def start(self) -> FaultProxy:
        self._loop = asyncio.get_running_loop()
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        return self

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for client, upstream in list(self._links):
            client.transport.abort()
            upstream.transport.abort()
        for task in list(self._tasks):
            task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.gather(*self._tasks, return_exceptions=True)

    async def __aenter__(self) -> FaultProxy:
        return await self.start()

    async def __aexit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.close()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            up_reader, up_writer = await asyncio.open_connection(self.host, self.port)
        except OSError:
            _reset(writer)
            return
        link = (writer, up_writer)
        self._links.add(link)
        pumps = [asyncio.ensure_future(self._pump(reader, up_writer, link, upward=True)),
                 asyncio.ensure_future(self._pump(up_reader, writer, link, upward=False))]
        self._tasks.update(pumps)
        try:
            await asyncio.gather(*pumps, return_exceptions=True)
        finally:
            self._tasks.difference_update(pumps)
            self._links.discard(link)
            for side in link:
                side.transport.abort()

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                    link: tuple[asyncio.StreamWriter, asyncio.StreamWriter], *,
                    upward: bool) -> None:
        """Forward one direction of ``link`` chunk by chunk, as the faults say."""
        loop = asyncio.get_running_loop()
        try:
            while data := await reader.read(_CHUNK):
                await self._open.wait()  # held: stop reading too, so TCP backs up
                if not upward and self._reset_next:
                    self._reset_next = False
                    writer.write(data[: max(1, len(data) // 2)])
                    self._reset_all()
                    return
                delay = self.latency / 2
                if delay > 0:
                    loop.call_later(delay, _write, writer, data)
                else:
                    writer.write(data)
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            _close(writer)  # the other side ended: so does this one

    def _reset_all(self) -> None:
        """Reset every connection now (RST, not FIN), the one being cut included."""
        for client, upstream in list(self._links):
            self.resets += 1
            _reset(client)
            _reset(upstream)


def _write(writer: asyncio.StreamWriter, data: bytes) -> None:
    if not writer.transport.is_closing():
        writer.write(data)


def _close(writer: asyncio.StreamWriter) -> None:
    if not writer.transport.is_closing():
        writer.close()


def _reset(writer: asyncio.StreamWriter) -> None:
    """Close ``writer``'s socket with a reset: SO_LINGER of zero, then abort."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


class ProxyProcess:
    """A ``FaultProxy`` in a process of its own, told what to do through its stdin: the
    test's load can't slow the link down (no lock, no collector shared)."""

    def __init__(self, process: subprocess.Popen[str], port: int) -> None:
        self._process = process
        self.listening_port = port

    @property
    def url(self) -> str:
        """``redis://`` URL of the proxy (database 0)."""
        return f"redis://127.0.0.1:{self.listening_port}/0"

    def _tell(self, *words: object) -> str:
        stdin, stdout = self._process.stdin, self._process.stdout
        assert stdin is not None and stdout is not None
        stdin.write(" ".join(map(str, words)) + "\n")
        stdin.flush()
        return stdout.readline().strip()

    @property
    def latency(self) -> float:
        return float(self._tell("latency?"))

    @latency.setter
    def latency(self, seconds: float) -> None:
        self._tell("latency", seconds)

    def hold(self) -> None:
        self._tell("hold")

    def reset_mid_reply(self) -> None:
        self._tell("reset")

    def clear(self) -> None:
        self._tell("clear")

    @property
    def resets(self) -> int:
        return int(self._tell("resets?"))


@contextlib.contextmanager
def fault_proxy(host: str, port: int) -> Iterator[ProxyProcess]:
    """A ``FaultProxy`` to ``host:port`` in a process of its own (``ProxyProcess``)."""
    process = subprocess.Popen(
        [sys.executable, "-m", "tests.faults_proxy", host, str(port)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1,
        cwd=Path(__file__).resolve().parent.parent)
    try:
        assert process.stdout is not None
        first = process.stdout.readline().split()
        if first[:1] != ["port"]:
            msg = f"the fault proxy did not start: {first!r}"
            raise RuntimeError(msg)
        yield ProxyProcess(process, int(first[1]))
    finally:
        process.kill()
        process.wait(5)
        for pipe in (process.stdin, process.stdout):
            if pipe is not None:
                pipe.close()


async def _serve(host: str, port: int) -> None:
    """The proxy process: commands on stdin, one answer line each on stdout."""
    proxy = await FaultProxy(host, port).start()
    print("port", proxy.listening_port, flush=True)
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    while line := (await reader.readline()).decode():
        word, *rest = line.split()
        answer: object = "ok"
        if word == "latency":
            proxy.latency = float(rest[0])
        elif word == "latency?":
            answer = proxy.latency
        elif word == "hold":
            proxy.hold()
        elif word == "reset":
            proxy.reset_mid_reply()
        elif word == "clear":
            proxy.clear()
        elif word == "resets?":
            answer = proxy.resets
        print(answer, flush=True)
    await proxy.close()


if __name__ == "__main__":
    asyncio.run(_serve(sys.argv[1], int(sys.argv[2])))

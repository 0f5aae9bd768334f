"""Tail latency of the middleware over a big heap: a storage holding a million identities.

For each storage (memory, and Redis on a redis-server of the script's own) and each
garbage-collector setting (``gc.collect(); gc.freeze()`` at start-up or not), the
script starts uvicorn (httptools + uvloop) on ``latency_app.py``, which fills the
storage with ``--keys`` identities before it listens. It then measures the server's
capacity (``--connections`` keep-alive connections, each sending its next request as
soon as the last is answered), and drives a steady open-loop load at ``--load`` of it
(requests sent on a fixed schedule, each request's latency counted from the moment it
was due, so a stall counts for every request it delays). The requests spread over the
filled identities, and one in ten is a new one. Printed: p50/p99/p99.9 and the
longest latency, the longest event-loop pause (a 1 ms ticker in the server), the
longest garbage collection (both on the wall clock and in the server's CPU time), what
a full collection costs once the run is over (none may come within it), and how many
decisions did not come from the storage (failed open after a timeout: the target is
none). Times are in milliseconds.

    python benchmarks/latency.py [--keys 1000000] [--seconds 20] [--load 0.5]
                                 [--rate R] [--storage memory redis] [--freeze both|yes|no]
                                 [--build source|compiled] [--connections 32]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

from instructions import throwaway_redis  # benchmarks/ is on sys.path

from middleware import BUILDS, SERVERS, _forget, _free_port

HERE = Path(__file__).resolve().parent
START_TIMEOUT = 900.0  # seconds: filling a million Redis keys takes a while


class Result(NamedTuple):
    """One steady run."""

    storage: str
    freeze: bool
    capacity: float
    rate: float
    latencies: list[float]
    statuses: dict[int, int]
    server: dict[str, object]


def _request(key: str) -> bytes:
    return f"GET / HTTP/1.1\r\nHost: bench\r\nx-client: {key}\r\n\r\n".encode()


async def _exchange(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                    request: bytes) -> int:
    """Send ``request``, read the response; its status."""
    writer.write(request)
    head = await reader.readuntil(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.lower() == b"content-length":
            length = int(value)
    await reader.readexactly(length)
    return int(head.split(b" ", 2)[1])


def _keys(filled: int) -> Iterator[str]:
    """Identities to send: the filled ones at random, and one new one in ten."""
    fresh = 0
    while True:
        fresh += 1
        if fresh % 10 == 0:
            yield f"new{uuid.uuid4().hex}"
        else:
            yield f"c{random.randrange(filled)}"


async def _capacity(port: int, connections: int, seconds: float, filled: int) -> float:
    """Requests per second the server answers, each connection sending back to back."""
    keys = _keys(filled)
    done = 0
    stop = time.monotonic() + seconds

    async def worker() -> None:
        nonlocal done
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            while time.monotonic() < stop:
                await _exchange(reader, writer, _request(next(keys)))
                done += 1
        finally:
            writer.close()

    start = time.monotonic()
    await asyncio.gather(*(worker() for _ in range(connections)))
    return done / (time.monotonic() - start)


async def _steady(port: int, connections: int, rate: float, seconds: float,
                  filled: int) -> tuple[list[float], dict[int, int]]:
    """``rate`` requests per second on a fixed schedule for ``seconds``; each latency
    from the moment its request was due (late sends included), and the statuses."""
    keys = _keys(filled)
    total = int(rate * seconds)
    latencies: list[float] = []
    statuses: dict[int, int] = {}
    start = time.perf_counter() + 0.1

    async def worker(first: int) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            for n in range(first, total, connections):
                due = start + n / rate
                wait = due - time.perf_counter()
                if wait > 0:
                    await asyncio.sleep(wait)
                status = await _exchange(reader, writer, _request(next(keys)))
                latencies.append(time.perf_counter() - due)
                statuses[status] = statuses.get(status, 0) + 1
        finally:
            writer.close()

    await asyncio.gather(*(worker(i) for i in range(connections)))
    return latencies, statuses


async def _stats(port: int, query: str = "") -> dict[str, object]:
    """The server's probe figures (``query``: ``reset=1``, ``collect=1``)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        path = f"/stats?{query}"
        writer.write(f"GET {path} HTTP/1.1\r\nHost: bench\r\n\r\n".encode())
        head = await reader.readuntil(b"\r\n\r\n")
        length = int(next(line.split(b":")[1] for line in head.split(b"\r\n")
                          if line.lower().startswith(b"content-length")))
        return dict(json.loads(await reader.readexactly(length)))
    finally:
        writer.close()


@contextlib.contextmanager
def _server(storage_url: str, keys: int, freeze: bool, build: str,
            prefix: str) -> Iterator[int]:
    """uvicorn serving ``latency_app`` on a free port, once it listens (filled)."""
    port = _free_port()
    path = os.pathsep.join(p for p in (str(BUILDS[build]), os.environ.get("PYTHONPATH", ""))
                           if p)
    env = {**os.environ, "BENCH_STORAGE": storage_url, "BENCH_KEYS": str(keys),
           "BENCH_FREEZE": "1" if freeze else "0", "BENCH_PREFIX": prefix,
           "PYTHONPATH": path}
    proc = subprocess.Popen(
        [sys.executable, "-m", "uvicorn", "--factory", "--app-dir", str(HERE),
         "latency_app:create_app", "--host", "127.0.0.1", "--port", str(port),
         "--log-level", "warning", "--no-access-log", "--lifespan", "on",
         *SERVERS["httptools"]], env=env, cwd=BUILDS[build])
    try:
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            if proc.poll() is not None:
                msg = "the server exited before it listened"
                raise SystemExit(msg)
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port)):
                break
            if time.monotonic() > deadline:
                msg = f"the server did not listen within {START_TIMEOUT:g} s"
                raise SystemExit(msg)
            time.sleep(0.5)
        yield port
    finally:
        proc.terminate()
        proc.wait(timeout=60)


def run(storage: str, storage_url: str, freeze: bool, args: argparse.Namespace) -> Result:
    """Fill, measure the capacity, then the steady load, on one server."""
    prefix = f"latency:{uuid.uuid4().hex[:8]}:"
    try:
        with _server(storage_url, args.keys, freeze, args.build, prefix) as port:
            capacity = asyncio.run(_capacity(port, args.connections, 3.0, args.keys))
            rate = args.rate or capacity * args.load
            asyncio.run(_stats(port, "reset=1"))
            latencies, statuses = asyncio.run(
                _steady(port, args.connections, rate, args.seconds, args.keys))
            server = asyncio.run(_stats(port, "collect=1"))
    finally:
        if storage == "redis":
            _forget(storage_url, prefix)
    return Result(storage, freeze, capacity, rate, latencies, statuses, server)


def _percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


def table(results: list[Result]) -> list[str]:
    """The markdown table of the runs (times in milliseconds)."""
    lines = ["| storage | gc.freeze() | capacity req/s | load req/s | p50 | p99 | p99.9 | "
             "max | longest loop pause: wall / cpu | longest gc: wall / cpu (gen) | "
             "full gc after: wall / cpu | undecided / decisions |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for done in results:
        ms = [1000 * _percentile(done.latencies, f) for f in (0.5, 0.99, 0.999)]
        server = done.server
        undecided = sum(dict(server["undecided"]).values())  # type: ignore[call-overload]
        lines.append(
            f"| {done.storage} | {'yes' if done.freeze else 'no'} | {done.capacity:.0f} | "
            f"{done.rate:.0f} | {ms[0]:.2f} | {ms[1]:.2f} | {ms[2]:.2f} | "
            f"{1000 * max(done.latencies):.1f} | {server['loop_pause_ms']:.1f} / "
            f"{server['loop_pause_cpu_ms']:.1f} | {server['gc_longest_ms']:.1f} / "
            f"{server['gc_longest_cpu_ms']:.1f} ({server['gc_longest_generation']}) | "
            f"{server['full_gc_ms']:.1f} / {server['full_gc_cpu_ms']:.1f} | "
            f"{undecided} / {server['decisions']} |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, default=1_000_000, help="identities filled")
    parser.add_argument("--seconds", type=float, default=20, help="seconds of steady load")
    parser.add_argument("--load", type=float, default=0.5, help="fraction of the capacity")
    parser.add_argument("--rate", type=float, default=0.0,
                        help="requests per second instead (on a host whose capacity moves)")
    parser.add_argument("--connections", type=int, default=32)
    parser.add_argument("--storage", nargs="+", choices=("memory", "redis"),
                        default=["memory", "redis"])
    parser.add_argument("--freeze", choices=("both", "yes", "no"), default="both")
    parser.add_argument("--build", choices=sorted(BUILDS), default="source",
                        help="ratelimit_mw from source (what pip install gives, the "
                             "default) or compiled by scripts/compile")
    args = parser.parse_args()
    freezes = {"both": (True, False), "yes": (True,), "no": (False,)}[args.freeze]
    results = []
    with contextlib.ExitStack() as stack:
        for storage in args.storage:
            url = "memory://" if storage == "memory" else stack.enter_context(
                throwaway_redis())
            for freeze in freezes:
                results.append(run(storage, url, freeze, args))
                print(table(results[-1:])[-1], file=sys.stderr, flush=True)
    print(f"# {' '.join([os.path.basename(sys.executable), *sys.argv])}")
    load = f"{args.rate:g} req/s" if args.rate else f"{args.load:g} of the capacity"
    print(f"# {args.keys} identities, {args.seconds:g} s at {load}, "
          f"{args.connections} connections, uvicorn httptools + uvloop, ratelimit_mw "
          f"{args.build}; times in ms")
    for done in results:
        if set(done.statuses) != {200}:
            print(f"# WARNING: {done.storage} (freeze {done.freeze}) answered {done.statuses}")
    print("\n".join(table(results)))


if __name__ == "__main__":
    main()

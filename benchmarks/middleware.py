"""Throughput of RateLimitMiddleware against a bare Starlette app, under uvicorn.

Each app runs in its own uvicorn subprocess (one worker) and is loaded with ``wrk``
(or, without it, a small asyncio HTTP/1.1 keep-alive load generator). Printed:
requests per second of each app and its ratio to the bare app.

    python benchmarks/middleware.py [--seconds 5] [--connections 32] [--redis URL]

Apps (this module is also the uvicorn app module, see ``create_app``):
    bare     Starlette, one plain-text route
    memory   + the middleware on memory storage, every request admitted
    redis    + the middleware on Redis, every request admitted
    denial   + the middleware on Redis, the one client over its limit (answered
             from the local cache of blocked keys, no Redis call)
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route

APPS = ("bare", "memory", "redis", "denial")  # also "quiet": memory, no headers
TARGETS = {"memory": 0.90, "redis": 0.45, "denial": 0.80}


async def _hello(request: Request) -> Response:
    return PlainTextResponse("hello")


def create_app() -> Starlette:
    """The app named by $BENCH_APP (uvicorn ``--factory`` entry point)."""
    from ratelimit_mw.middleware import RateLimitMiddleware
    from ratelimit_mw.tiers import Tier

    kind = os.environ.get("BENCH_APP", "bare")
    app = Starlette(routes=[Route("/", _hello)])
    if kind == "bare":
        return app
    redis_url = os.environ.get("BENCH_REDIS", "redis://127.0.0.1:6379/0")
    prefix = os.environ.get("BENCH_PREFIX", "bench:")
    if kind == "memory":
        app.add_middleware(RateLimitMiddleware, tiers=[Tier("t", "1000000000/minute")],
                           storage_url="memory://")
    elif kind == "quiet":
        app.add_middleware(RateLimitMiddleware, tiers=[Tier("t", "1000000000/minute")],
                           storage_url="memory://", header_style="none")
    elif kind == "redis":
        app.add_middleware(RateLimitMiddleware, tiers=[Tier("t", "1000000000/minute")],
                           storage_url=redis_url, storage_prefix=prefix)
    elif kind == "denial":
        app.add_middleware(RateLimitMiddleware, tiers=[Tier("t", "1/hour")],
                           storage_url=redis_url, storage_prefix=prefix)
    else:
        msg = f"unknown BENCH_APP {kind!r}; expected one of {APPS}"
        raise SystemExit(msg)
    return app


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _wait_for(port: int, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            msg = "uvicorn exited before it listened"
            raise SystemExit(msg)
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.05)
    msg = "uvicorn did not listen within 20 s"
    raise SystemExit(msg)


def _serve(kind: str, redis_url: str, python: str) -> tuple[subprocess.Popen[bytes], int]:
    port = _free_port()
    src = str(Path(__file__).resolve().parent.parent / "src")
    path = os.pathsep.join(p for p in (src, os.environ.get("PYTHONPATH", "")) if p)
    env = {**os.environ, "BENCH_APP": kind, "BENCH_REDIS": redis_url, "PYTHONPATH": path,
           "BENCH_PREFIX": f"bench:{uuid.uuid4().hex[:8]}:"}
    proc = subprocess.Popen(
        [python, "-m", "uvicorn", "--factory", "--app-dir", str(Path(__file__).parent),
         "middleware:create_app", "--host", "127.0.0.1", "--port", str(port), "--workers", "1",
         "--log-level", "warning", "--no-access-log", "--lifespan", "on"],
        env=env)
    _wait_for(port, proc)
    return proc, port


def _wrk(port: int, seconds: float, connections: int) -> float:
    out = subprocess.run(
        ["wrk", "-t1", f"-c{connections}", f"-d{seconds:g}s", f"http://127.0.0.1:{port}/"],
        check=True, capture_output=True, text=True).stdout
    match = re.search(r"Requests/sec:\s+([\d.]+)", out)
    if match is None:
        msg = f"couldn't read wrk's output:\n{out}"
        raise SystemExit(msg)
    return float(match.group(1))


async def _python_load(port: int, seconds: float, connections: int) -> float:
    """A keep-alive HTTP/1.1 GET loop on ``connections`` sockets; requests per second."""
    request = b"GET / HTTP/1.1\r\nHost: bench\r\n\r\n"
    done = 0
    stop = time.monotonic() + seconds

    async def worker() -> None:
        nonlocal done
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            while time.monotonic() < stop:
                writer.write(request)
                head = await reader.readuntil(b"\r\n\r\n")
                length = int(re.search(rb"content-length: (\d+)", head, re.I).group(1))  # type: ignore[union-attr]
                await reader.readexactly(length)
                done += 1
        finally:
            writer.close()

    start = time.monotonic()
    await asyncio.gather(*(worker() for _ in range(connections)))
    return done / (time.monotonic() - start)


def measure(kind: str, redis_url: str, seconds: float, connections: int, python: str) -> float:
    """Requests per second of one app (after a one-second warm-up)."""
    proc, port = _serve(kind, redis_url, python)
    try:
        if shutil.which("wrk"):
            _wrk(port, 1, connections)
            return _wrk(port, seconds, connections)
        asyncio.run(_python_load(port, 1, connections))
        return asyncio.run(_python_load(port, seconds, connections))
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=5)
    parser.add_argument("--connections", type=int, default=32)
    parser.add_argument("--redis", default=os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0"))
    parser.add_argument("--rounds", type=int, default=1, help="runs per app; the best counts")
    parser.add_argument("--python", default=sys.executable,
                        help="interpreter that runs uvicorn (e.g. one with uvicorn[standard])")
    parser.add_argument("apps", nargs="*", default=list(APPS))
    args = parser.parse_args()
    tool = "wrk" if shutil.which("wrk") else "python load generator"
    server = subprocess.run(
        [args.python, "-c", "import importlib.util as u; print('httptools+uvloop' if "
         "u.find_spec('httptools') and u.find_spec('uvloop') else 'h11+asyncio')"],
        capture_output=True, text=True, check=True).stdout.strip()
    print(f"# {tool}, {args.connections} connections, {args.seconds:g} s per run, "
          f"uvicorn 1 worker ({server}), best of {args.rounds}")
    results: dict[str, float] = {}
    # Rounds interleave the apps, so a noisy neighbour hurts them all alike.
    for _ in range(args.rounds):
        for kind in ["bare", *(a for a in args.apps if a != "bare")]:
            rate = measure(kind, args.redis, args.seconds, args.connections, args.python)
            results[kind] = max(rate, results.get(kind, 0.0))
    bare = results["bare"]
    print(f"{'app':<8} {'req/s':>10} {'ratio':>7} {'target':>7}")
    for kind, rate in results.items():
        target = TARGETS.get(kind)
        verdict = "" if target is None else ("ok" if rate / bare >= target else "MISS")
        mark = "" if target is None else f"{target:>7.2f} {verdict}"
        print(f"{kind:<8} {rate:>10.0f} {rate / bare:>7.2f} {mark}")


if __name__ == "__main__":
    main()

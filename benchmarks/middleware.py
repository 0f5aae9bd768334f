"""Throughput of RateLimitMiddleware against a bare Starlette app, under uvicorn.

Each app runs in its own uvicorn subprocess (one worker) and is loaded with ``wrk``
(or, without it, a small asyncio HTTP/1.1 keep-alive load generator). Printed:
requests per second of each app (its best run) and its ratio to the bare app (the
median over the rounds; the bare app runs again after every two apps, and each app
is compared with the bare runs just before and after it).

    python benchmarks/middleware.py [--seconds 5] [--connections 32] [--redis URL]
                                    [--server auto|h11|httptools]
                                    [--build compiled|source] [apps...]

``--build compiled`` (the default) measures ``build/compiled``, the wheel with the
per-request path compiled by mypyc (``scripts/compile`` makes it); ``source`` the .py
files of the ``ratelimit_mw/`` package. The peers run the same way either way.

Apps (this module is also the uvicorn app module, see ``create_app``):
    bare     Starlette, one plain-text route
    headers  bare, plus four constant X-RateLimit-* headers added by a minimal pure
             ASGI wrapper: the ceiling for any limiter that sends the legacy headers
    floor    the least a limiter must do beyond that: a fixed-window count per client
             IP in a dict, its remaining count and reset formatted into the headers
    memory   + the middleware on memory storage, every request admitted
    memory-metrics
             memory, counted by Prometheus metrics (``ratelimit_mw.metrics``)
    redis    + the middleware on Redis, every request admitted
    memory-settled, redis-settled
             memory and redis with the tier's limit counting failures only
             (``Limit(..., count="failures")``): each request reserves one unit
             before the app and, its 200 not counting, has it refunded after the
             response (one settle per request)
    denial   + the middleware on Redis, the one client over its limit (answered
             from the local cache of blocked keys, no Redis call)
    memory-tier, redis-tier
             + the middleware with a tier of three limits (token bucket, sliding
             window, fixed window) and a concurrency slot, usage history on: one
             decision takes the slot, the three limits and the usage buckets, and
             the slot is given back when the response ends

After the throughput table, the Redis round trips per request of ``redis-tier`` are
counted on a redis-server of the benchmark's own (``--no-round-trips`` skips it):
commands sent by clients, from ``MONITOR`` (which tells them from the commands the
Lua script runs), and every command run, from ``INFO commandstats`` deltas.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

from redis_count import ClientCommands  # benchmarks/ is on sys.path (script or --app-dir)
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route
from starlette.types import Message, Receive, Scope, Send

APPS = ("bare", "headers", "floor", "quiet", "memory", "memory-metrics", "redis", "denial",
        "memory-tier", "redis-tier", "memory-settled", "redis-settled")
PEERS = (  # the other libraries doing the same job, from benchmarks/peer_apps.py
    "limits-memory", "limits-redis", "slowapi-memory", "slowapi-redis",
    "asgi-ratelimit-memory", "asgi-ratelimit-redis", "fastapi-limiter-memory",
    "fastapi-limiter-redis",
)
# "headers": bare + four constant headers (what sending them costs by itself); "quiet":
# memory without headers (what deciding costs by itself)
TARGETS = {"memory": 0.90, "redis": 0.45, "denial": 0.80, "memory-tier": 0.80,
           "redis-tier": 0.40}
_HUGE = 1_000_000_000


async def _hello(request: Request) -> Response:
    return PlainTextResponse("hello")


def create_app() -> Starlette:
    """The app named by $BENCH_APP (uvicorn ``--factory`` entry point)."""
    from ratelimit_mw.middleware import RateLimitMiddleware
    from ratelimit_mw.settings import RateLimitSettings
    from ratelimit_mw.tiers import Tier

    kind = os.environ.get("BENCH_APP", "bare")
    app = Starlette(routes=[Route("/", _hello)])
    if kind == "bare":
        return app
    if kind == "headers":
        return _with_constant_headers(app)  # type: ignore[return-value]
    if kind == "floor":
        return _with_least_limiter(app)  # type: ignore[return-value]
    redis_url = os.environ.get("BENCH_REDIS", "redis://127.0.0.1:6379/0")
    prefix = os.environ.get("BENCH_PREFIX", "bench:")
    # A generous storage timeout (under full load, or valgrind, the default 50 ms can
    # pass while the event loop is busy, and the fail-open path would be measured
    # instead); BENCH_FAILURE_MODE=closed makes any failed decision a 503 to be seen.
    common: dict[str, Any] = {
        "storage_prefix": prefix,
        "storage_timeout": float(os.environ.get("BENCH_STORAGE_TIMEOUT", "2.0")),
        "failure_mode": os.environ.get("BENCH_FAILURE_MODE", "open"),
    }
    if kind in ("memory", "quiet", "redis"):
        app.add_middleware(
            RateLimitMiddleware,
            tiers=[Tier("t", "1000000000/minute")],
            settings=RateLimitSettings(
                storage_url="memory://" if kind != "redis" else redis_url,
                header_style="none" if kind == "quiet" else "legacy", **common),
        )
    elif kind in ("memory-settled", "redis-settled"):
        from ratelimit_mw.limits import Limit

        # memory / redis, but the limit counts failures only: the unit reserved before
        # the app is refunded after each (200) response, one settle per request
        app.add_middleware(
            RateLimitMiddleware,
            tiers=[Tier("t", [Limit(f"{_HUGE}/minute", count="failures")])],
            settings=RateLimitSettings(
                storage_url="memory://" if kind == "memory-settled" else redis_url, **common),
        )
    elif kind == "memory-metrics":
        from ratelimit_mw.metrics import PrometheusMetrics

        app.add_middleware(
            RateLimitMiddleware,
            tiers=[Tier("t", "1000000000/minute")],
            settings=RateLimitSettings(storage_url="memory://", **common),
            metrics=PrometheusMetrics(),
        )
    elif kind in ("memory-tier", "redis-tier"):
        from ratelimit_mw.limits import Limit

        tier = Tier("t", [
            Limit(f"{_HUGE}/minute", "token_bucket", burst=_HUGE, name="burst"),
            Limit(f"{_HUGE}/hour", "sliding_window", name="hourly"),
            Limit(f"{_HUGE}/day", "fixed_window", name="daily"),
        ], concurrency=_HUGE)
        url = "memory://" if kind == "memory-tier" else redis_url
        app.add_middleware(
            RateLimitMiddleware,
            tiers=[tier],
            settings=RateLimitSettings(storage_url=url, quota_history=True, **common),
        )
    elif kind == "denial":
        app.add_middleware(
            RateLimitMiddleware,
            tiers=[Tier("t", "1/hour")],
            settings=RateLimitSettings(storage_url=redis_url, **common),
        )
    elif kind in PEERS:
        from peer_apps import build  # benchmarks/ is uvicorn's --app-dir

        return build(kind, redis_url, prefix)  # type: ignore[return-value]
    else:
        msg = f"unknown BENCH_APP {kind!r}; expected one of {(*APPS, *PEERS)}"
        raise SystemExit(msg)
    return app


def _with_constant_headers(app: Starlette) -> object:
    """``app`` answering with the four legacy headers a limiter sends, as constants."""
    headers = [(b"x-ratelimit-limit", b"1000000000"),
               (b"x-ratelimit-remaining", b"999999999"),
               (b"x-ratelimit-reset", b"1764460800"),
               (b"x-ratelimit-policy", b'1000000000;w=60;comment="per minute"')]

    async def wrapper(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await app(scope, receive, send)
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", ()), *headers]
            await send(message)

        await app(scope, receive, send_with_headers)

    return wrapper


def _with_least_limiter(app: Starlette) -> object:
    """``app`` behind the least a limiter sending the legacy headers must do: key the
    request by client IP, count it in a fixed window kept in a dict, and format the
    remaining count and reset time into the four headers. No configuration, no
    algorithm choice, no failure policy: the floor any limiter's count stands on."""
    counts: dict[str, tuple[int, int]] = {}
    limit, window = 1_000_000_000, 60

    async def wrapper(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await app(scope, receive, send)
            return
        key = scope["client"][0]
        now = int(time.time())
        start = now - now % window
        began, used = counts.get(key, (start, 0))
        used = used + 1 if began == start else 1
        counts[key] = (start, used)
        headers = [(b"x-ratelimit-limit", b"1000000000"),
                   (b"x-ratelimit-remaining", b"%d" % (limit - used)),
                   (b"x-ratelimit-reset", b"%d" % (start + window)),
                   (b"x-ratelimit-policy", b'1000000000;w=60;comment="per minute"')]

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", ()), *headers]
            await send(message)

        await app(scope, receive, send_with_headers)

    return wrapper


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


ROOT = Path(__file__).resolve().parent.parent
# Each build is run from its own directory: ``python -m`` puts the working directory
# first on the path, so from the repository the sources would shadow the compiled build.
BUILDS = {"compiled": ROOT / "build" / "compiled", "source": ROOT}
_build = "compiled"  # set by main()
SERVERS = {"auto": [], "h11": ["--http", "h11", "--loop", "asyncio"],
           "httptools": ["--http", "httptools", "--loop", "uvloop"]}
_server = "auto"  # set by main()


def _serve(
    kind: str, redis_url: str, python: str, prefix: str = "bench:",
) -> tuple[subprocess.Popen[bytes], int]:
    port = _free_port()
    build = str(BUILDS[_build])
    path = os.pathsep.join(p for p in (build, os.environ.get("PYTHONPATH", "")) if p)
    env = {**os.environ, "BENCH_APP": kind, "BENCH_REDIS": redis_url, "PYTHONPATH": path,
           "BENCH_PREFIX": prefix}
    proc = subprocess.Popen(
        [python, "-m", "uvicorn", "--factory", "--app-dir", str(Path(__file__).parent),
         "middleware:create_app", "--host", "127.0.0.1", "--port", str(port), "--workers", "1",
         "--log-level", "warning", "--no-access-log", "--lifespan", "on", *SERVERS[_server]],
        env=env, cwd=build)
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


class Run(NamedTuple):
    """One measured run of one app."""

    rate: float
    """Requests per second."""
    app_us: float
    """CPU time of the uvicorn process per request, in microseconds."""
    redis_us: float
    """CPU time of redis-server per request (0: not measured, e.g. Redis elsewhere)."""


def _cpu_seconds(pid: int | None) -> float:
    """User plus system CPU time of a local process so far (0 when it can't be read)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError, TypeError):
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _redis_pid(redis_url: str) -> int | None:
    """redis-server's process id, when it runs on this machine."""
    import redis

    try:
        client = redis.Redis.from_url(redis_url)
        try:
            pid = int(client.info("server")["process_id"])
        finally:
            client.close()
    except (redis.RedisError, KeyError, ValueError):
        return None
    return pid if os.path.exists(f"/proc/{pid}/stat") else None


def measure(kind: str, redis_url: str, seconds: float, connections: int, python: str) -> Run:
    """Requests per second of one app (after a one-second warm-up), and the CPU time
    per request it cost the server and redis-server."""
    prefix = f"bench:{uuid.uuid4().hex[:8]}:"
    proc, port = _serve(kind, redis_url, python, prefix)
    redis_pid = _redis_pid(redis_url)
    try:
        load = (lambda s: _wrk(port, s, connections)) if shutil.which("wrk") else (
            lambda s: asyncio.run(_python_load(port, s, connections)))
        load(1)
        app, server = _cpu_seconds(proc.pid), _cpu_seconds(redis_pid)
        rate = load(seconds)
        app, server = _cpu_seconds(proc.pid) - app, _cpu_seconds(redis_pid) - server
        served = max(1.0, rate * seconds)
        return Run(rate, app / served * 1e6, server / served * 1e6)
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        if kind not in ("bare", "headers", "floor", "memory", "quiet", "memory-tier",
                        "memory-settled"):
            _forget(redis_url, prefix)


def _forget(redis_url: str, prefix: str) -> None:
    """Delete the run's keys (usage history would otherwise stay for 90 days)."""
    import redis

    client = redis.Redis.from_url(redis_url)
    try:
        names = list(client.scan_iter(match=f"{prefix}*", count=1000))
        for start in range(0, len(names), 500):
            client.delete(*names[start:start + 500])
    finally:
        client.close()


def _commands(client: object) -> dict[str, int]:
    stats = client.info("commandstats")  # type: ignore[attr-defined]
    return {name.removeprefix("cmdstat_"): int(value["calls"]) for name, value in stats.items()}


def round_trips(python: str, fallback_url: str, requests: int = 500) -> None:
    """Print the Redis round trips per request of ``redis-tier``, on a redis-server of
    our own so that no other client's commands are counted."""
    import redis

    server = shutil.which("redis-server")
    own: subprocess.Popen[bytes] | None = None
    url = fallback_url
    if server is not None:
        port = _free_port()
        own = subprocess.Popen([server, "--port", str(port), "--bind", "127.0.0.1",
                                "--save", "", "--appendonly", "no"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        url = f"redis://127.0.0.1:{port}/0"
    else:
        print("# (no redis-server: counting on the shared Redis, other clients included)")
    client = redis.Redis.from_url(url)
    proc = None
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                client.ping()
                break
            except redis.ConnectionError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        proc, port = _serve("redis-tier", url, python)
        asyncio.run(_python_load_count(port, 20, 1))  # warm up: the script gets loaded
        with ClientCommands(url) as sent:
            before = _commands(client)
            asyncio.run(_python_load_count(port, requests, 1))
            after = _commands(client)
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(timeout=10)
        client.close()
        if own is not None:
            own.kill()
            own.wait(timeout=10)
    counts = sent.counts
    print(f"redis-tier, {requests} requests: round trips per request " + ", ".join(
        f"{name} {calls / requests:.2f}" for name, calls in sorted(counts.items())) +
        f"; total {sum(counts.values()) / requests:.2f} (target: 1 before the app, "
        f"at most 1 more to give the slot back)")
    ran = {name: after[name] - before.get(name, 0) for name in after
           if name not in ("info", "echo", "monitor", "hello", "client")}
    print("  commands run per request, inside the script included: " + ", ".join(
        f"{name} {calls / requests:.2f}" for name, calls in sorted(ran.items()) if calls))


async def _python_load_count(port: int, requests: int, connections: int) -> None:
    """Exactly ``requests`` keep-alive GETs, one at a time per connection."""
    request = b"GET / HTTP/1.1\r\nHost: bench\r\n\r\n"
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        for _ in range(requests):
            writer.write(request)
            head = await reader.readuntil(b"\r\n\r\n")
            length = int(re.search(rb"content-length: (\d+)", head, re.I).group(1))  # type: ignore[union-attr]
            await reader.readexactly(length)
    finally:
        writer.close()


def compare(apps: list[str], rounds: int, run: Callable[[str], Run],
            ) -> tuple[dict[str, float], dict[str, list[float]], dict[str, list[Run]]]:
    """Each app's best req/s, its ratios to the bare app (one per round), and its runs.

    The bare app runs again after every two apps, and each app is compared with the
    mean of the bare runs just before and after it: on a machine whose speed drifts
    (a shared VM), a ratio then compares runs a few seconds apart, not the best of
    each over the whole run.
    """
    others = [app for app in apps if app != "bare"]
    best: dict[str, float] = {}
    ratios: dict[str, list[float]] = {app: [] for app in others}
    runs: dict[str, list[Run]] = {app: [] for app in ["bare", *others]}

    def run_of(app: str) -> float:
        done = run(app)
        runs[app].append(done)
        best[app] = max(done.rate, best.get(app, 0.0))
        return done.rate

    for _ in range(rounds):
        before = run_of("bare")
        for start in range(0, len(others), 2):
            rates = {app: run_of(app) for app in others[start:start + 2]}
            after = run_of("bare")
            for app, rate in rates.items():
                ratios[app].append(rate / ((before + after) / 2))
            before = after
    return best, ratios, runs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=5)
    parser.add_argument("--connections", type=int, default=32)
    parser.add_argument("--redis", default=os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0"))
    parser.add_argument("--rounds", type=int, default=1,
                        help="runs per app; the median ratio counts")
    parser.add_argument("--python", default=sys.executable,
                        help="interpreter that runs uvicorn (e.g. one with uvicorn[standard])")
    parser.add_argument("--no-round-trips", action="store_true",
                        help="skip counting Redis commands per request of redis-tier")
    parser.add_argument("--no-peers", action="store_true", help="skip the peer libraries")
    parser.add_argument("--server", choices=sorted(SERVERS), default="auto",
                        help="uvicorn's HTTP parser and loop: h11+asyncio (plain 'pip install "
                             "uvicorn'), httptools+uvloop (uvicorn[standard]), or auto")
    parser.add_argument("--build", choices=sorted(BUILDS), default="compiled",
                        help="ratelimit_mw as compiled by scripts/compile (default), or its "
                             "sources")
    parser.add_argument("apps", nargs="*", default=[])
    args = parser.parse_args()
    if not (BUILDS[args.build] / "ratelimit_mw").is_dir():
        msg = f"{BUILDS[args.build]} holds no ratelimit_mw: run scripts/compile first"
        raise SystemExit(msg)
    if not args.apps:
        args.apps = list(APPS) if args.no_peers else [*APPS, *PEERS]
    global _server, _build
    _server, _build = args.server, args.build
    tool = "wrk" if shutil.which("wrk") else "python load generator"
    server = {"h11": "h11+asyncio", "httptools": "httptools+uvloop"}.get(args.server) or (
        subprocess.run(
            [args.python, "-c", "import importlib.util as u; print('httptools+uvloop' if "
             "u.find_spec('httptools') and u.find_spec('uvloop') else 'h11+asyncio')"],
            capture_output=True, text=True, check=True).stdout.strip())
    print(f"# {tool}, {args.connections} connections, {args.seconds:g} s per run, "
          f"uvicorn 1 worker ({server}), {args.rounds} round(s), ratelimit_mw from "
          f"{args.build}")
    best, ratios, runs = compare(args.apps, args.rounds, lambda kind: measure(
        kind, args.redis, args.seconds, args.connections, args.python))
    print("# ratio: the median over the rounds of req/s against the bare app measured just "
          "before and after (range in brackets); req/s: the best run")
    print("# app us, redis us: median CPU time per request of the uvicorn process and of "
          "redis-server; cpu ratio: bare's app us over the app's (steadier on a noisy host)")
    print(f"{'app':<23} {'req/s':>8} {'ratio':>6} {'(range)':>12} {'target':>12} "
          f"{'app us':>7} {'cpu ratio':>9} {'redis us':>8}")
    bare_us = statistics.median(r.app_us for r in runs["bare"])
    for kind, rate in best.items():
        app_us = statistics.median(r.app_us for r in runs[kind])
        redis_us = statistics.median(r.redis_us for r in runs[kind])
        cpu = f"{app_us:>7.1f} {bare_us / app_us if app_us else 0:>9.2f} {redis_us:>8.1f}"
        if kind == "bare":
            print(f"{kind:<23} {rate:>8.0f} {1:>6.2f} {'':>12} {'':>12} {cpu}")
            continue
        ratio = statistics.median(ratios[kind])
        target = TARGETS.get(kind)
        verdict = "" if target is None else ("ok" if ratio >= target else "MISS")
        mark = "" if target is None else f"{target:.2f} {verdict}"
        spread = f"({min(ratios[kind]):.2f}-{max(ratios[kind]):.2f})"
        print(f"{kind:<23} {rate:>8.0f} {ratio:>6.2f} {spread:>12} {mark:>12} {cpu}")
    if not args.no_round_trips and "redis-tier" in args.apps:
        round_trips(args.python, args.redis)


if __name__ == "__main__":
    main()

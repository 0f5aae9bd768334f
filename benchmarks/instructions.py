"""Instructions per request of the uvicorn server process, counted by callgrind.

Each app of ``benchmarks/middleware.py`` (see its ``create_app``) runs in its own uvicorn
process under ``valgrind --tool=callgrind`` with instrumentation off. The script warms
it up over keep-alive connections, switches instrumentation on (``callgrind_control -i
on``), sends an exact number of requests over the same connections, dumps the counts
(``callgrind_control --dump``) and divides the dump's total ``Ir`` by the requests: the
warm-up, connection set-up and server start are not counted. Unlike requests per second
the count hardly depends on the host: the same app counted twice agrees to about 0.1 %.
The Redis apps vary more (about 1 % with 8 connections: how many decisions share one
pipeline depends on timing); ``--repeat 3`` takes the median, ``--connections 1`` counts
them without coalescing. The kernel's share of a request is not counted, so ratios of
instructions come out lower than ratios of throughput.

    python benchmarks/instructions.py [--build both|compiled|source] [--server httptools|h11]
                                      [--requests 4000] [--warmup 2000] [--connections 8]
                                      [--repeat 1] [--redis URL] [--python PYTHON]
                                      [--peers] [--keep DIR] [--json FILE] [apps...]

Apps default to ``bare headers memory memory-tier redis redis-tier``; the two controls
``bare`` and ``headers`` are counted whatever is named. ``--peers`` adds the peer apps
of ``benchmarks/peer_apps.py`` whose packages the server's Python has. ratelimit_mw's
apps are counted on both builds by default (from source, what ``pip install`` gives, and
compiled by ``scripts/compile``); the controls and peers once. For the Redis apps
without ``--redis``, a throwaway ``redis-server`` is started on a free port and stopped
at the end. The server runs with a storage timeout of 60 s and the failure mode closed,
and the script stops unless every response has the app's status, so no fail-open
answer is ever counted. Printed (see ``instruction_table.py``): a markdown table of
instructions per request per build with the ratios app/headers and app/bare, and the
commands that produced it. ``--keep`` saves each dump for ``callgrind_annotate``. For
example:

    ./scripts/compile
    python benchmarks/instructions.py --requests 2000 --peers bare headers memory quiet

Needs valgrind (``callgrind_control`` included) and, for ``--server httptools``, a
``--python`` with httptools and uvloop (``uvicorn[standard]``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib
import json
import os
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from importlib.machinery import EXTENSION_SUFFIXES
from pathlib import Path
from typing import TypedDict

import redis
from instruction_table import Count, expected_status, progress, report, results

# benchmarks/ is on sys.path: first when run as a script, uvicorn's --app-dir in the server
from middleware import APPS, BUILDS, PEERS, SERVERS, _forget, _free_port
from middleware import create_app as _create_app

HERE = Path(__file__).resolve().parent
DEFAULT_APPS = ("bare", "headers", "memory", "memory-tier", "redis", "redis-tier")
CONTROLS = ("bare", "headers")
WITHOUT_RATELIMIT_MW = (*CONTROLS, "floor")
"""The apps of ``middleware.py`` that do not run ratelimit_mw: counted on one build."""
REDIS_APPS = frozenset({"redis", "denial", "redis-tier", "redis-settled"}).union(
    peer for peer in PEERS if peer.endswith("-redis"))
# The modules each peer library needs, by the peer app's name less its storage.
PEER_MODULES = {"limits": ("limits",), "slowapi": ("slowapi",),
                "asgi-ratelimit": ("ratelimit",),
                "fastapi-limiter": ("fastapi_limiter", "pyrate_limiter")}
SERVER_MODULES = {"httptools": ("uvicorn", "httptools", "uvloop"), "h11": ("uvicorn", "h11")}
REQUEST = b"GET / HTTP/1.1\r\nHost: bench\r\n\r\n"
START_TIMEOUT = 300.0  # seconds for uvicorn to listen: Python starts ~50x slower under valgrind
PHASE_TIMEOUT = 1800.0  # seconds for the warm-up or the counted requests


@dataclass(frozen=True)
class Settings:
    """How every app is served and loaded."""

    build: str
    server: str
    python: str
    requests: int
    warmup: int
    connections: int
    redis_url: str
    keep: Path | None = None
    """Where each app's callgrind dump is kept (None: not kept)."""


class Origin(TypedDict):
    """Where the server process imported ratelimit_mw from."""

    package: str
    middleware: str
    mypyc: list[str]
    """The files of mypyc's runtime modules (``<hash>__mypyc``) it imported."""


def create_app() -> object:
    """``middleware.create_app()``, after writing where ratelimit_mw came from to $BENCH_ORIGIN."""
    path = os.environ.get("BENCH_ORIGIN")
    if path:
        Path(path).write_text(json.dumps(_origin()))
    return _create_app()


def _origin() -> Origin:
    """The files this process imports ratelimit_mw, its middleware and mypyc's runtime from."""
    package = importlib.import_module("ratelimit_mw")
    middleware = importlib.import_module("ratelimit_mw.middleware")
    runtime = sorted(str(getattr(module, "__file__", "")) for name, module in sys.modules.items()
                     if name.endswith("__mypyc"))
    return Origin(package=str(package.__file__), middleware=str(middleware.__file__),
                  mypyc=runtime)


def _check_origin(origin: Origin, build: str) -> str:
    """A line saying where the server imported ratelimit_mw from; SystemExit if not ``build``."""
    package = Path(origin["package"]).resolve().parent
    expected = (BUILDS[build] / "ratelimit_mw").resolve()
    compiled = origin["middleware"].endswith(tuple(EXTENSION_SUFFIXES))
    if package != expected or compiled != (build == "compiled"):
        msg = (f"the server imported ratelimit_mw from {package} (middleware "
               f"{origin['middleware']}), not the {build} build in {expected}")
        raise SystemExit(msg)
    kind = "compiled" if compiled else "source"
    runtime = ", ".join(origin["mypyc"]) or "none"
    return f"ratelimit_mw from {package} (middleware {kind}; mypyc runtime: {runtime})"


def _missing_modules(python: str, modules: Sequence[str]) -> set[str]:
    """Those of ``modules`` that ``python`` cannot import."""
    code = ("import importlib.util, sys\n"
            "print(' '.join(m for m in sys.argv[1:] if importlib.util.find_spec(m) is None))")
    out = subprocess.run([python, "-c", code, *modules], capture_output=True, text=True,
                         check=True).stdout
    return set(out.split())


def _peer_modules(peer: str) -> tuple[str, ...]:
    """The modules the peer app ``peer`` imports."""
    return PEER_MODULES[peer.rsplit("-", 1)[0]]


def _server_command(settings: Settings, out_dir: Path, port: int) -> list[str]:
    """valgrind running uvicorn on this module's ``create_app``, instrumentation off."""
    return [
        "valgrind", "--tool=callgrind", "--cache-sim=no", "--instr-atstart=no", "--vgdb=yes",
        f"--callgrind-out-file={out_dir / 'callgrind.out.%p'}",
        f"--log-file={out_dir / 'valgrind.log'}",
        settings.python, "-m", "uvicorn", "--factory", "--app-dir", str(HERE),
        "instructions:create_app", "--host", "127.0.0.1", "--port", str(port), "--workers", "1",
        "--log-level", "warning", "--no-access-log", "--lifespan", "on",
        # an idle connection would be closed after 5 s; the gaps between phases are shorter,
        # but a slow host under valgrind should not end a run
        "--timeout-keep-alive", "60", *SERVERS[settings.server],
    ]


def _server_env(app: str, settings: Settings, out_dir: Path) -> dict[str, str]:
    """The variables set for the server (beside the inherited ones)."""
    build = str(BUILDS[settings.build])
    path = os.pathsep.join(p for p in (build, os.environ.get("PYTHONPATH", "")) if p)
    return {"BENCH_APP": app, "BENCH_REDIS": settings.redis_url,
            "BENCH_PREFIX": f"bench:{uuid.uuid4().hex[:8]}:",
            "BENCH_ORIGIN": str(out_dir / "origin.json"), "PYTHONPATH": path,
            "PYTHONHASHSEED": "0",  # the same set and dict layouts from run to run
            # Python runs ~50x slower under valgrind: a storage call must not time out,
            # and one that fails anyway answers 503, which the status check catches.
            "BENCH_STORAGE_TIMEOUT": "60", "BENCH_FAILURE_MODE": "closed"}


def _shell_line(command: Sequence[str], env: dict[str, str], cwd: Path) -> str:
    """``command`` as one line for a shell, with its directory and variables."""
    variables = " ".join(f"{name}={shlex.quote(value)}" for name, value in env.items())
    return f"cd {shlex.quote(str(cwd))} && {variables} {shlex.join(command)}"


def _wait_for(port: int, proc: subprocess.Popen[bytes], out_dir: Path) -> None:
    """Return once the server accepts connections; SystemExit if it exits or never does."""
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            msg = f"the server exited before it listened:\n{_server_output(out_dir)}"
            raise SystemExit(msg)
        with contextlib.suppress(OSError), _connected(port):
            return
        time.sleep(0.2)
    msg = f"the server did not listen within {START_TIMEOUT:g} s:\n{_server_output(out_dir)}"
    raise SystemExit(msg)


@contextlib.contextmanager
def _connected(port: int) -> Iterator[None]:
    """A short-lived connection to the server, to see it listens."""
    with socket.create_connection(("127.0.0.1", port), timeout=1):
        yield


def _server_output(out_dir: Path) -> str:
    """The end of what the server and valgrind wrote, to explain a failure."""
    texts = (path.read_text(errors="replace") for path in sorted(out_dir.glob("*.log")))
    return "\n".join(text[-3000:] for text in texts)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """Stop the server, killing it if it does not end within a minute."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


async def _callgrind(pid: int, *options: str) -> None:
    """Run ``callgrind_control`` with ``options`` on the server; SystemExit if it fails."""
    proc = await asyncio.create_subprocess_exec(
        "callgrind_control", *options, str(pid),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
    out, _ = await proc.communicate()
    if proc.returncode or not out.rstrip().endswith(b"OK."):  # it exits 0 on errors too
        msg = f"callgrind_control {' '.join(options)} {pid} failed:\n{out.decode()}"
        raise SystemExit(msg)


async def _response(reader: asyncio.StreamReader) -> int:
    """Read one response; its status code."""
    head = await reader.readuntil(b"\r\n\r\n")
    status_line, *lines = head.decode("latin-1").split("\r\n")
    for line in lines:
        name, _, value = line.partition(":")
        if name.lower() == "content-length":
            await reader.readexactly(int(value))
            return int(status_line.split(" ", 2)[1])
    msg = f"a response without content-length: {head!r}"
    raise SystemExit(msg)


async def _send(connections: Sequence[tuple[asyncio.StreamReader, asyncio.StreamWriter]],
                requests: int) -> Counter[int]:
    """Send exactly ``requests`` GETs, one in flight per connection; the statuses."""
    statuses: Counter[int] = Counter()
    left = requests

    async def worker(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal left
        while left > 0:
            left -= 1
            writer.write(REQUEST)
            statuses[await _response(reader)] += 1

    async with asyncio.timeout(PHASE_TIMEOUT):
        await asyncio.gather(*(worker(reader, writer) for reader, writer in connections))
    return statuses


async def _drive(pid: int, port: int, settings: Settings) -> tuple[Counter[int], float, float]:
    """Warm up, then count ``settings.requests`` requests; statuses, warm-up and counted s."""
    connections = [await asyncio.open_connection("127.0.0.1", port)
                   for _ in range(settings.connections)]
    try:
        start = time.monotonic()
        await _send(connections, settings.warmup)
        warmed = time.monotonic()
        await _callgrind(pid, "--instr=on")
        statuses = await _send(connections, settings.requests)
        await _callgrind(pid, "--dump=counted requests")
        counted = time.monotonic()
        await _callgrind(pid, "--instr=off")
    finally:
        for _, writer in connections:
            writer.close()
    return statuses, warmed - start, counted - warmed


def _total_ir(out_dir: Path, pid: int) -> int:
    """The total ``Ir`` of the one dump callgrind_control asked for."""
    dumps = list(out_dir.glob(f"callgrind.out.{pid}.*"))
    if len(dumps) != 1:
        msg = f"expected one callgrind dump in {out_dir}, found {[p.name for p in dumps]}"
        raise SystemExit(msg)
    # "totals:" is the sum of the dump's costs ("summary:" reads 0 in a dump taken while
    # instrumentation is off)
    for line in dumps[0].read_text().splitlines():
        if line.startswith("totals:"):
            return int(line.split()[1])
    msg = f"no totals: line in {dumps[0]}"
    raise SystemExit(msg)


def count(app: str, settings: Settings) -> Count:
    """Count the instructions the server runs for ``settings.requests`` requests to ``app``."""
    begin = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="callgrind-") as tmp:
        out_dir = Path(tmp)
        port = _free_port()
        command = _server_command(settings, out_dir, port)
        env = _server_env(app, settings, out_dir)
        cwd = BUILDS[settings.build]  # not the repository: ``-m`` puts the directory first
        with (out_dir / "server.log").open("wb") as output:
            proc = subprocess.Popen(command, env={**os.environ, **env}, cwd=cwd,
                                    stdout=output, stderr=subprocess.STDOUT)
        try:
            _wait_for(port, proc, out_dir)
            started = time.monotonic() - begin
            origin = _check_origin(json.loads((out_dir / "origin.json").read_text()),
                                   settings.build)
            statuses, warmed, counted = asyncio.run(_drive(proc.pid, port, settings))
            instructions = _total_ir(out_dir, proc.pid)
            if settings.keep is not None:  # for callgrind_annotate
                settings.keep.mkdir(parents=True, exist_ok=True)
                for dump in out_dir.glob(f"callgrind.out.{proc.pid}.*"):
                    shutil.copy(dump, settings.keep / f"{app}.{settings.build}.callgrind.out")
        finally:
            _stop(proc)
            if app in REDIS_APPS and settings.redis_url:
                _forget(settings.redis_url, env["BENCH_PREFIX"])
    return Count(app, settings.build, instructions, settings.requests, dict(statuses),
                 started, warmed, counted, time.monotonic() - begin,
                 _shell_line(command, env, cwd), origin)


@contextlib.contextmanager
def throwaway_redis() -> Iterator[str]:
    """A redis-server of our own on a free port, without persistence; its URL."""
    binary = shutil.which("redis-server")
    if binary is None:
        msg = "no redis-server to start for the Redis apps: pass --redis URL"
        raise SystemExit(msg)
    port = _free_port()
    with tempfile.TemporaryDirectory(prefix="redis-") as tmp:
        proc = subprocess.Popen(
            [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", tmp],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        url = f"redis://127.0.0.1:{port}/0"
        try:
            client = redis.Redis.from_url(url)
            try:
                _ping(client)
            finally:
                client.close()
            yield url
        finally:
            proc.terminate()
            proc.wait(timeout=10)


def _ping(client: redis.Redis, timeout: float = 10.0) -> None:
    """Wait until ``client`` answers PING."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            client.ping()
            return
        except redis.ConnectionError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def _apps(named: Sequence[str], peers: bool, python: str) -> list[str]:
    """The apps to count: the controls first, then those named, then installed peers."""
    known = (*APPS, *PEERS)
    unknown = [app for app in named if app not in known]
    if unknown:
        msg = f"unknown app(s) {', '.join(unknown)}; expected some of {', '.join(known)}"
        raise SystemExit(msg)
    apps = list(dict.fromkeys([*CONTROLS, *(named or DEFAULT_APPS)]))
    wanted = [peer for peer in PEERS if peer in apps or peers]
    missing = _missing_modules(python, sorted({m for p in wanted for m in _peer_modules(p)}))
    absent = [peer for peer in wanted if missing.intersection(_peer_modules(peer))]
    if absent and not peers:
        msg = f"{python} cannot import the packages of {', '.join(absent)}"
        raise SystemExit(msg)
    if absent:
        print(f"# skipped, packages not installed: {', '.join(absent)}", file=sys.stderr)
    return [*apps, *(p for p in wanted if p not in apps and p not in absent)]


def _check_tools(settings: Settings, builds: Sequence[str]) -> None:
    """SystemExit unless valgrind, the builds and the server's modules are there."""
    for tool in ("valgrind", "callgrind_control"):
        if shutil.which(tool) is None:
            msg = f"{tool} not found: apt-get install valgrind"
            raise SystemExit(msg)
    for build in builds:
        if not (BUILDS[build] / "ratelimit_mw").is_dir():
            msg = f"{BUILDS[build]} holds no ratelimit_mw: run scripts/compile first"
            raise SystemExit(msg)
    missing = _missing_modules(settings.python, SERVER_MODULES[settings.server])
    if missing:
        msg = (f"{settings.python} cannot import {', '.join(sorted(missing))} for --server "
               f"{settings.server}: pass --python with uvicorn[standard] installed")
        raise SystemExit(msg)


def _runs(apps: Sequence[str], builds: Sequence[str]) -> list[tuple[str, str]]:
    """(app, build) in the order counted: the controls and the peers once (they do not
    run ratelimit_mw), ratelimit_mw's apps on every build."""
    ours = [app for app in apps if app in APPS and app not in WITHOUT_RATELIMIT_MW]
    once = [app for app in apps if app not in ours]
    return [*((app, builds[0]) for app in once),
            *((app, build) for build in builds for app in ours)]


def _checked(done: Count) -> Count:
    """``done``, or SystemExit when a response had another status than expected: a
    failed decision (a 503 with the failure mode closed) must not be counted."""
    expected = expected_status(done.app)
    if set(done.statuses) != {expected}:
        msg = (f"{done.app} [{done.build}] answered {done.statuses}, not only {expected}: "
               f"not counted")
        raise SystemExit(msg)
    return done


def main() -> None:
    """Parse the arguments, count every app and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--build", choices=[*sorted(BUILDS), "both"], default="both",
                        help="ratelimit_mw from source and compiled by scripts/compile "
                             "(both, the default), or one of them")
    parser.add_argument("--server", choices=sorted(SERVER_MODULES), default="httptools",
                        help="httptools + uvloop (default) or h11 + asyncio")
    parser.add_argument("--requests", type=int, default=4000, help="requests counted per app")
    parser.add_argument("--warmup", type=int, default=2000, help="requests before counting")
    parser.add_argument("--connections", type=int, default=8, help="keep-alive connections")
    parser.add_argument("--repeat", type=int, default=1, help="runs per app (all apps in turn)")
    parser.add_argument("--redis", default="",
                        help="Redis URL for the Redis apps (default: a throwaway redis-server)")
    parser.add_argument("--python", default=sys.executable, help="interpreter running uvicorn")
    parser.add_argument("--keep", type=Path, default=None,
                        help="keep each app's dump here, for callgrind_annotate")
    parser.add_argument("--peers", action="store_true",
                        help="also count the peer apps whose packages are installed")
    parser.add_argument("--json", type=Path, default=None,
                        help="also write each app's median here (benchmarks/chart.py draws it)")
    parser.add_argument("apps", nargs="*", help=f"default: {' '.join(DEFAULT_APPS)}")
    args = parser.parse_args()
    if min(args.requests, args.connections, args.repeat) < 1 or args.warmup < 0:
        parser.error("--requests, --connections and --repeat must be positive")
    builds = ("source", "compiled") if args.build == "both" else (args.build,)
    apps = _apps(args.apps, args.peers, args.python)
    settings = Settings(builds[0], args.server, args.python, args.requests, args.warmup,
                        args.connections, args.redis, args.keep)
    _check_tools(settings, builds)
    with contextlib.ExitStack() as stack:
        if not settings.redis_url and REDIS_APPS.intersection(apps):
            settings = replace(settings, redis_url=stack.enter_context(throwaway_redis()))
        counts: list[Count] = []
        for run in range(1, args.repeat + 1):
            for app, build in _runs(apps, builds):
                counts.append(_checked(count(app, replace(settings, build=build))))
                print(progress(counts[-1], run, args.repeat), file=sys.stderr, flush=True)
    print("\n".join(report(counts, args.server, args.requests, args.warmup,
                           args.connections, args.repeat)))
    if args.json is not None:
        args.json.write_text(json.dumps(
            results(counts, args.server, args.requests, args.connections), indent=2) + "\n")


if __name__ == "__main__":
    main()

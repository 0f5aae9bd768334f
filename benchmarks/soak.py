"""Soak: minutes of mixed traffic through an app on Redis, watching for slow growth.

An app runs under uvicorn in a subprocess, deciding on Redis under a key prefix of
its own; a bounded async load generator (``--concurrency`` keep-alive connections)
sends mixed traffic: several API keys and client IPs, a few of them hot enough to
go over their limits, some requests to a slow endpoint. Every ``--interval``
seconds (default a minute; a quarter of the run when it is under 4 minutes) it
prints throughput, statuses, p99 latency, Redis ``used_memory``, the prefix's key
count and the server's RSS (master and workers); at the end it compares the first
and the last interval and says whether anything grew.

    python benchmarks/soak.py [--minutes 10] [--app module:attr] [--redis URL]
                              [--workers 1] [--concurrency 16]
                              [--path /x ...] [--api-key K ...]

``--app`` defaults to ``example_app.main:app`` when it can be imported, else to
``tests.reliability.app:app``; the traffic of both is known (their routes and API
keys), other apps get ``--path`` (default ``/``) and ``--api-key`` (default made-up
keys). The app reads ``RATELIMIT_*`` settings from the environment; the soak sets
the storage URL and a prefix of its own, ``RATELIMIT_KEY=api_key`` and, for apps
without tiers of their own, a tier of 600/minute.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.util
import math
import os
import random
import signal
import socket
import statistics
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import redis as sync_redis

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.reliability.servers import RawHTTP, Reply, Request  # noqa: E402

TEST_APP = "tests.reliability.app:app"
EXAMPLE_APP = "example_app.main:app"


@dataclass(frozen=True, slots=True)
class Traffic:
    """What the load sends: weighted paths, and API keys (the first few are hot)."""

    paths: list[tuple[str, int]]
    keys: list[str]
    hot: int = 3


TRAFFIC = {
    TEST_APP: Traffic([("/", 55), ("/alg/sliding_window", 20), ("/alg/gcra", 10),
                       ("/alg/fixed_window", 5), ("/slow?ms=150", 10)],
                      [f"soak-key-{i}" for i in range(20)]),
    EXAMPLE_APP: Traffic([("/api/v1/hello", 85), ("/api/v1/slow?seconds=0.15", 10),
                          ("/api/v1/account/quota", 5)],
                         ["demo-free", "demo-starter", "demo-pro", "demo-enterprise"], hot=1),
}


def default_app() -> str:
    try:
        found = importlib.util.find_spec("example_app.main") is not None
    except ModuleNotFoundError:
        found = False
    return EXAMPLE_APP if found else TEST_APP


@dataclass(slots=True)
class Interval:
    """What one reporting interval saw (replies of the slow endpoint apart)."""

    replies: list[Reply] = field(default_factory=list)
    slow: list[Reply] = field(default_factory=list)
    started: float = field(default_factory=time.monotonic)


@dataclass(frozen=True, slots=True)
class Sample:
    """One line of the report."""

    at: float
    rps: float
    statuses: dict[int, int]
    p99_ms: float  # every request but the slow endpoint's
    p99_slow_ms: float
    redis_mb: float  # server-wide: other clients of the same Redis count too
    prefix_kb: float  # the soak's own keys (MEMORY USAGE)
    keys: int
    rss_mb: float

    def line(self) -> str:
        minutes, seconds = divmod(int(self.at), 60)
        codes = " ".join(f"{code or 'err'}:{n}" for code, n in sorted(self.statuses.items()))
        return (f"[{minutes:3d}:{seconds:02d}] {self.rps:7.1f} req/s  p99 {self.p99_ms:6.1f} ms "
                f"(slow endpoint {self.p99_slow_ms:6.1f} ms)  redis used_memory "
                f"{self.redis_mb:6.2f} MB, soak keys {self.keys} = {self.prefix_kb:.1f} kB  "
                f"server RSS {self.rss_mb:6.1f} MB  ({codes})")


def _rss_mb(pid: int) -> float:
    """Resident memory of ``pid`` and its descendants, from /proc."""
    total = 0
    todo = [pid]
    while todo:
        current = todo.pop()
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{current}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
            children = Path(f"/proc/{current}/task/{current}/children").read_text().split()
            todo.extend(int(child) for child in children)
    return total / 1024


def _redis_state(client: sync_redis.Redis, prefix: str) -> tuple[float, int, float]:
    """Redis used_memory (MB), the soak's key count and their memory (kB, from a sample)."""
    used = int(client.info("memory")["used_memory"]) / 2**20
    names = list(client.scan_iter(match=f"{prefix}*", count=1000))
    sample = names[:2000]
    sizes = [client.memory_usage(name) or 0 for name in sample]
    kb = sum(sizes) / 1024 * (len(names) / len(sample)) if sample else 0.0
    return used, len(names), kb


def _p99_ms(replies: list[Reply]) -> float:
    latencies = [reply.latency for reply in replies]
    if len(latencies) < 2:
        return 1000 * sum(latencies)
    return 1000 * statistics.quantiles(latencies, n=100)[98]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.contextmanager
def _server(app: str, env: dict[str, str], workers: int) -> Iterator[tuple[str, int]]:
    """uvicorn serving ``app``; (base URL, pid). Its process group is stopped on exit."""
    port = _free_port()
    argv = [sys.executable, "-m", "uvicorn", app, "--host", "127.0.0.1", "--port", str(port),
            "--workers", str(workers), "--log-level", "warning", "--no-access-log",
            "--no-proxy-headers"]  # X-Forwarded-For is the middleware's (trusted_proxies)
    proc = subprocess.Popen(argv, cwd=ROOT, env={**os.environ, **env}, start_new_session=True)
    try:
        deadline = time.monotonic() + 30
        while True:
            if proc.poll() is not None or time.monotonic() > deadline:
                msg = f"uvicorn {app} did not start (exit code {proc.poll()})"
                raise SystemExit(msg)
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
                break
            time.sleep(0.1)
        yield f"http://127.0.0.1:{port}", proc.pid
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)


def _requests(traffic: Traffic, until: float, seed: int,
              slow_ids: set[int]) -> Iterator[tuple[int, Request]]:
    """Mixed requests until ``until``: 40% from the hot keys (over their limits), 45%
    from the other keys, 15% keyless from 10 client IPs (X-Forwarded-For). The numbers
    of requests to a slow endpoint go into ``slow_ids``."""
    rng = random.Random(seed)
    population = [path for path, _ in traffic.paths]
    weights = [weight for _, weight in traffic.paths]
    hot, rest = traffic.keys[:traffic.hot], traffic.keys[traffic.hot:] or traffic.keys
    i = 0
    while time.monotonic() < until:
        roll = rng.random()
        if roll < 0.4:
            headers = {"x-api-key": rng.choice(hot)}
        elif roll < 0.85:
            headers = {"x-api-key": rng.choice(rest)}
        else:
            headers = {"x-forwarded-for": f"198.51.100.{rng.randrange(10)}"}
        path = rng.choices(population, weights)[0]
        if "slow" in path:
            slow_ids.add(i)
        yield i, (path, headers)
        i += 1


def _sample(interval: Interval, at: float, redis_client: sync_redis.Redis, prefix: str,
            pid: int) -> Sample:
    replies = interval.replies + interval.slow
    elapsed = max(1e-9, time.monotonic() - interval.started)
    used, keys, kb = _redis_state(redis_client, prefix)
    return Sample(at, len(replies) / elapsed, dict(Counter(r.status for r in replies)),
                  _p99_ms(interval.replies), _p99_ms(interval.slow), used, kb, keys,
                  _rss_mb(pid))


def _verdict(first: Sample, last: Sample) -> list[str]:
    """Lines saying, for each measure, whether it grew from the first to the last interval."""
    checks = [
        ("server RSS", first.rss_mb, last.rss_mb, "MB", 1.10, 5.0),
        ("soak keys in Redis", first.keys, last.keys, "", 1.10, 10),
        ("their memory", first.prefix_kb, last.prefix_kb, "kB", 1.10, 64.0),
        ("p99 latency", first.p99_ms, last.p99_ms, "ms", 1.50, 20.0),
    ]
    lines = []
    for name, before, after, unit, ratio, slack in checks:
        grew = after > before * ratio + slack
        word = "GREW" if grew else "stable"
        lines.append(f"  {name:22s} {before:9.1f} -> {after:9.1f} {unit:2s}  {word}")
    lines.append(f"  {'(redis used_memory)':22s} {first.redis_mb:9.1f} -> {last.redis_mb:9.1f} MB  "
                 f"server-wide, other clients included: not judged")
    return lines


async def soak(args: argparse.Namespace) -> int:
    prefix = f"soak:{uuid.uuid4().hex[:8]}:"
    traffic = TRAFFIC.get(args.app, Traffic([("/", 1)], [f"soak-key-{i}" for i in range(20)]))
    if args.path:
        traffic = Traffic([(path, 1) for path in args.path], traffic.keys, traffic.hot)
    if args.api_key:
        traffic = Traffic(traffic.paths, args.api_key, max(1, len(args.api_key) // 5))
    env = {
        "RATELIMIT_STORAGE_URL": args.redis,
        "RATELIMIT_STORAGE_PREFIX": prefix,
        "RATELIMIT_KEY": "api_key",
        "RATELIMIT_TRUSTED_PROXIES": "127.0.0.1",
        "RATELIMIT_DEFAULT_LIMITS": "600/minute",
        "RATELIMIT_FAILURE_MODE": "open",
        "RL_APP_LIMIT": "100",
        "RL_APP_PERIOD": "minute",
    }
    redis_client = sync_redis.Redis.from_url(args.redis)
    duration = args.minutes * 60
    print(f"soak: {args.app} on {args.redis} (prefix {prefix}), {args.workers} worker(s), "
          f"{args.concurrency} connections, {args.minutes:g} min, report every {args.interval} s",
          flush=True)
    samples: list[Sample] = []
    try:
        with _server(args.app, env, args.workers) as (url, pid):
            start = time.monotonic()
            current = Interval()
            slow_ids: set[int] = set()
            load = RawHTTP(url, connections=args.concurrency, timeout=30)

            def record(i: int, reply: Reply) -> None:
                if i in slow_ids:
                    slow_ids.discard(i)
                    current.slow.append(reply)
                else:
                    current.replies.append(reply)

            runner = asyncio.create_task(load.run(
                _requests(traffic, start + duration, args.seed, slow_ids), record,
                pause=args.pause))
            count = max(1, math.ceil(duration / args.interval - 1e-9))
            for k in range(1, count + 1):
                end = start + min(k * args.interval, duration)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(asyncio.shield(runner),
                                           max(0.0, end - time.monotonic()))
                if k == count:
                    await runner  # the requests still in flight end this interval
                finished, current = current, Interval()
                sample = await asyncio.to_thread(_sample, finished, time.monotonic() - start,
                                                 redis_client, prefix, pid)
                samples.append(sample)
                print(sample.line(), flush=True)
    finally:
        with contextlib.suppress(sync_redis.RedisError):
            names = list(redis_client.scan_iter(match=f"{prefix}*", count=1000))
            if names:
                redis_client.delete(*names)
        redis_client.close()
    if len(samples) < 2:
        print("only one interval: nothing to compare (use --interval below the duration)")
        return 0
    print(f"growth, first interval -> last interval (of {len(samples)}):")
    lines = _verdict(samples[0], samples[-1])
    print("\n".join(lines))
    grew = any("GREW" in line for line in lines)
    print("verdict: something grew" if grew else "verdict: nothing grew without bound")
    errors = sum(s.statuses.get(0, 0) + s.statuses.get(500, 0) for s in samples)
    if errors:
        print(f"errors: {errors} requests failed or got a 500")
    return 1 if grew or errors else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--interval", type=float, default=None,
                        help="seconds between report lines (default 60; a quarter of "
                             "the run when it is shorter than 4 minutes)")
    parser.add_argument("--app", default=default_app(), help="module:attr of the ASGI app")
    parser.add_argument("--redis", default=os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0"))
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--pause", type=float, default=0.005,
                        help="seconds each connection waits between two requests")
    parser.add_argument("--path", action="append", help="a path to request (repeatable)")
    parser.add_argument("--api-key", action="append",
                        help="an API key to send (repeatable; the first fifth are hot)")
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    if args.interval is None:
        args.interval = 60.0 if args.minutes >= 4 else args.minutes * 60 / 4
    return asyncio.run(soak(args))


if __name__ == "__main__":
    raise SystemExit(main())

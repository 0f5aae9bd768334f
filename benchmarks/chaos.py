"""Chaos soak: mixed traffic through 4 workers of the example app while Redis misbehaves.

A redis-server of the run's own serves the example app (``closed`` failure mode) under
uvicorn with ``--workers 4``; the soak's load (``soak.py``'s mixed traffic from
several API keys) runs the whole time while, on a schedule, Redis is killed and
restarted, frozen (SIGSTOP) past the storage's grace period and resumed, and slowed
(``DEBUG SLEEP``). Afterwards it checks, and prints:

- no 5xx but the 503s ``closed`` mode promises while Redis is down (no 500, no
  failed request);
- every concurrency slot back: ``in_flight`` 0 on the quota endpoint for every key;
- per key, admitted requests within the limits over the whole run: a token bucket's
  burst plus its rate times the run, one burst more per restart (Redis keeps nothing
  on disk here, so a restart forgets the counters);
- server RSS and the run's Redis key count flat from the first quiet interval to the
  last.

    python benchmarks/chaos.py [--minutes 3] [--every 20] [--concurrency 16]

It exits 1 when anything was lost. ``tests/reliability/test_chaos.py`` runs a short
version (about a minute, each fault once).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import os
import signal
import sys
import time
import uuid
from collections import Counter
from pathlib import Path

import httpx
import redis as sync_redis

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.soak import (  # noqa: E402
    EXAMPLE_APP,
    TRAFFIC,
    _redis_state,
    _requests,
    _rss_mb,
    _server,
)
from tests.redis_servers import RedisProcess, own_redis  # noqa: E402
from tests.reliability.servers import RawHTTP, Reply  # noqa: E402

# (rate per second, burst) of each demo key's token bucket, from example_app/tiers.toml.
BUCKETS = {"demo-free": (10 / 60, 20), "demo-starter": (100 / 60, 200),
           "demo-pro": (1000 / 60, 2000)}


def _fault(redis: RedisProcess, kind: str, seconds: float) -> None:
    """One fault of ``kind`` lasting about ``seconds``: kill, freeze or slow."""
    if kind == "kill":
        redis.kill()
        time.sleep(seconds)
        redis.start()
    elif kind == "freeze":
        pid = int(redis.info("server")["process_id"])
        os.kill(pid, signal.SIGSTOP)
        try:
            time.sleep(seconds)
        finally:
            os.kill(pid, signal.SIGCONT)
    else:
        with contextlib.suppress(sync_redis.RedisError):
            redis.client(socket_timeout=seconds + 5).execute_command("DEBUG", "SLEEP", seconds)


def _schedule(duration: float, every: float) -> list[tuple[float, str, float]]:
    """(start, kind, seconds) of each fault: one every ``every`` seconds, in turn, none in
    the first 20 s nor the last 25 s (quiet: RSS and keys are compared there)."""
    kinds = [("kill", 2.0), ("freeze", 3.0), ("slow", 0.5)]
    at, faults = 20.0, []
    while at + 25 < duration:
        kind, seconds = kinds[len(faults) % len(kinds)]
        faults.append((at, kind, seconds))
        at += every
    return faults


def _in_flight(url: str, keys: list[str]) -> dict[str, int]:
    """``in_flight`` of each key's concurrency limit, from the quota endpoint."""
    found = {}
    with httpx.Client(base_url=url, timeout=5) as client:
        for key in keys:
            body = client.get("/api/v1/account/quota", headers={"x-api-key": key}).json()
            found[key] = int((body.get("concurrency") or {}).get("in_flight", 0))
    return found


async def chaos(args: argparse.Namespace) -> int:
    traffic = TRAFFIC[EXAMPLE_APP]
    prefix = f"chaos:{uuid.uuid4().hex[:8]}:"
    duration = args.minutes * 60
    with own_redis() as redis:
        url_redis = f"redis://127.0.0.1:{redis.port}/0"
        env = {"RATELIMIT_STORAGE_URL": url_redis, "RATELIMIT_STORAGE_PREFIX": prefix,
               "RATELIMIT_FAILURE_MODE": "closed", "RATELIMIT_TRUSTED_PROXIES": "127.0.0.1"}
        client = sync_redis.Redis(port=redis.port, socket_timeout=10)
        print(f"chaos: {EXAMPLE_APP}, 4 workers, Redis on port {redis.port}, "
              f"{args.minutes:g} min, {args.concurrency} connections", flush=True)
        with _server(EXAMPLE_APP, env, 4) as (url, pid):
            replies: list[tuple[str, str, Reply]] = []  # (API key, path, reply)
            sent: dict[int, tuple[str, str]] = {}
            start = time.monotonic()

            def record(i: int, reply: Reply) -> None:
                replies.append((*sent.pop(i, ("", "")), reply))

            def requests():  # type: ignore[no-untyped-def]
                for i, (path, headers) in _requests(traffic, start + duration, args.seed,
                                                     set()):
                    sent[i] = (headers.get("x-api-key", ""), path)
                    yield i, (path, headers)

            load = RawHTTP(url, connections=args.concurrency, timeout=30)
            runner = asyncio.create_task(load.run(requests(), record, pause=args.pause))
            await asyncio.sleep(15)
            first = (_rss_mb(pid), *await asyncio.to_thread(_redis_state, client, prefix))
            restarts = 0
            for at, kind, seconds in _schedule(duration, args.every):
                await asyncio.sleep(max(0.0, start + at - time.monotonic()))
                print(f"[{time.monotonic() - start:6.1f} s] {kind} Redis for {seconds:g} s",
                      flush=True)
                await asyncio.to_thread(_fault, redis, kind, seconds)
                restarts += kind == "kill"
            last = (_rss_mb(pid), *await asyncio.to_thread(_redis_state, client, prefix))
            await runner
            await asyncio.sleep(2)  # the last responses' slots go back
            in_flight = await asyncio.to_thread(_in_flight, url, list(BUCKETS))
        client.close()
    elapsed = time.monotonic() - start
    statuses = Counter(reply.status for _, _, reply in replies)
    # The quota endpoint is exempt from the limits: only the limited paths count.
    admitted = Counter(key for key, path, reply in replies
                       if reply.status == 200 and not path.startswith("/api/v1/account"))
    print(f"requests: {len(replies)} in {elapsed:.0f} s; statuses "
          + " ".join(f"{code or 'failed'}:{n}" for code, n in sorted(statuses.items())))
    bad = statuses.get(0, 0) + sum(n for code, n in statuses.items() if code >= 500
                                   and code != 503)
    print(f"5xx other than closed mode's 503, or failed requests: {bad}")
    print(f"in-flight after the run, per key: {in_flight}")
    over = []
    for key, (rate, burst) in BUCKETS.items():
        bound = (1 + restarts) * burst + math.ceil(rate * elapsed)
        print(f"admitted {key}: {admitted[key]} (bound {bound}: {1 + restarts} bursts of "
              f"{burst} + {rate:.3g}/s over the run)")
        if admitted[key] > bound:
            over.append(key)
    print(f"server RSS {first[0]:.1f} -> {last[0]:.1f} MB; run's Redis keys "
          f"{first[2]} -> {last[2]}")
    grew = last[0] > first[0] * 1.15 + 10 or last[2] > first[2] * 1.2 + 20
    ok = not bad and not any(in_flight.values()) and not over and not grew
    print("verdict: nothing lost" if ok else "verdict: SOMETHING WAS LOST (see above)")
    return 0 if ok else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=3.0)
    parser.add_argument("--every", type=float, default=20.0,
                        help="seconds between two faults")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--pause", type=float, default=0.01)
    parser.add_argument("--seed", type=int, default=7)
    return asyncio.run(chaos(parser.parse_args()))


if __name__ == "__main__":
    raise SystemExit(main())

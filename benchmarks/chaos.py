"""Chaos soak: mixed traffic through 4 workers of the example app while Redis misbehaves.

A Redis deployment of the run's own (``--deployment``: ``single``, ``cluster`` or
``sentinel``, see ``chaos_deployments.py``) serves the example app (``closed`` failure
mode) under uvicorn with ``--workers 4``; the soak's load (``soak.py``'s mixed traffic
from several API keys) runs the whole time while, on a schedule, the deployment's
faults come in turn: on one Redis, killed and restarted, frozen (SIGSTOP) past the
storage's grace period, slowed (``DEBUG SLEEP``), and through a proxy 500 ms of
latency, a held link and a reset mid-reply; on Cluster and Sentinel, failovers asked
for and primaries killed. Afterwards it checks, and prints:

- no 5xx but the 503s ``closed`` mode promises while Redis is down (no 500, no
  failed request);
- every concurrency slot back: ``in_flight`` 0 on the quota endpoint for every key,
  within a lease (5 s here) of the run's end;
- per key, admitted requests within the limits over the whole run: a token bucket's
  burst plus its rate times the run, one burst more per fault that may forget (Redis
  keeps nothing on disk here, so a restart forgets the counters; a promoted replica
  may lack the last writes);
- server RSS and the run's Redis key count flat from the first quiet interval to the
  last.

    python benchmarks/chaos.py [--deployment single] [--minutes 3] [--every 20]
        [--concurrency 16] [--faults kill,hold]

It exits 1 when anything was lost. ``tests/reliability/test_chaos.py`` runs a short
version of each deployment.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import sys
import time
import uuid
from collections import Counter
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.chaos_deployments import DEPLOYMENTS, Deployment, deployed  # noqa: E402
from benchmarks.soak import (  # noqa: E402
    EXAMPLE_APP,
    TRAFFIC,
    _redis_state,
    _requests,
    _rss_mb,
    _server,
)
from tests.redis_servers import RedisProcess  # noqa: E402
from tests.reliability.servers import RawHTTP, Reply  # noqa: E402

# (rate per second, burst) of each demo key's token bucket, from example_app/tiers.toml.
BUCKETS = {"demo-free": (10 / 60, 20), "demo-starter": (100 / 60, 200),
           "demo-pro": (1000 / 60, 2000)}


def _schedule(duration: float, every: float, faults: list[tuple[str, float]],
              warmup: float, cooldown: float) -> list[tuple[float, str, float]]:
    """(start, kind, seconds) of each fault: one every ``every`` seconds, in turn, none in
    the first ``warmup`` s nor the last ``cooldown`` s (quiet: RSS and keys are
    compared there)."""
    at, schedule = warmup, []
    while at + cooldown < duration:
        kind, seconds = faults[len(schedule) % len(faults)]
        schedule.append((at, kind, seconds))
        at += every
    return schedule


def _state(primaries: list[RedisProcess], prefix: str) -> tuple[float, int]:
    """Redis used_memory (MB) and the run's key count, summed over the primaries."""
    used, keys = 0.0, 0
    for node in primaries:
        client = node.client(socket_timeout=10)
        try:
            memory, count, _ = _redis_state(client, prefix)
        finally:
            client.close()
        used, keys = used + memory, keys + count
    return used, keys


LEASE = 5.0
"""Seconds of a concurrency slot's lease: a slot not given back (its primary failed as
it was) is back within it."""


def _slots_back(url: str, keys: list[str]) -> dict[str, int]:
    """``in_flight`` of each key once all are 0, or as they are a lease and 3 s after the
    run (a slot whose give-back met a failover is back at the end of its lease)."""
    deadline = time.monotonic() + LEASE + 3
    while True:
        time.sleep(1)
        found = _in_flight(url, keys)
        if not any(found.values()) or time.monotonic() > deadline:
            return found


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
    with deployed(args.deployment) as deployment:
        faults = _faults(deployment, args.faults)
        env = {"RATELIMIT_STORAGE_URL": deployment.url, "RATELIMIT_STORAGE_PREFIX": prefix,
               "RATELIMIT_FAILURE_MODE": "closed", "RATELIMIT_TRUSTED_PROXIES": "127.0.0.1",
               "RATELIMIT_CONCURRENCY_LEASE": str(LEASE)}
        print(f"chaos: {EXAMPLE_APP}, 4 workers, {args.deployment} Redis, "
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
            await asyncio.sleep(min(15.0, args.warmup * 0.75))
            first = (_rss_mb(pid), *await asyncio.to_thread(
                _state, deployment.primaries(), prefix))
            forgotten = 0
            for at, kind, seconds in _schedule(duration, args.every, faults, args.warmup,
                                               args.cooldown):
                await asyncio.sleep(max(0.0, start + at - time.monotonic()))
                print(f"[{time.monotonic() - start:6.1f} s] {kind} Redis for {seconds:g} s",
                      flush=True)
                await asyncio.to_thread(deployment.fault, kind, seconds)
                forgotten += kind in deployment.forgetting
            last = (_rss_mb(pid), *await asyncio.to_thread(
                _state, deployment.primaries(), prefix))
            await runner
            slots_back = time.monotonic()
            in_flight = await asyncio.to_thread(_slots_back, url, list(BUCKETS))
            slots_back = time.monotonic() - slots_back
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
    print(f"in-flight after the run, per key: {in_flight} ({slots_back:.1f} s after it)")
    over = []
    for key, (rate, burst) in BUCKETS.items():
        bound = (1 + forgotten) * burst + math.ceil(rate * elapsed)
        print(f"admitted {key}: {admitted[key]} (bound {bound}: {1 + forgotten} bursts of "
              f"{burst} + {rate:.3g}/s over the run)")
        if admitted[key] > bound:
            over.append(key)
    print(f"server RSS {first[0]:.1f} -> {last[0]:.1f} MB; run's Redis keys "
          f"{first[2]} -> {last[2]}")
    grew = last[0] > first[0] * 1.15 + 10 or last[2] > first[2] * 1.2 + 20
    ok = not bad and not any(in_flight.values()) and not over and not grew
    print("verdict: nothing lost" if ok else "verdict: SOMETHING WAS LOST (see above)")
    return 0 if ok else 1


def _faults(deployment: Deployment, named: str) -> list[tuple[str, float]]:
    """The deployment's faults, or those of them ``named`` (comma-separated)."""
    if not named:
        return list(deployment.faults)
    known = dict(deployment.faults)
    wanted = [name.strip() for name in named.split(",") if name.strip()]
    unknown = [name for name in wanted if name not in known]
    if unknown:
        msg = (f"--faults {named!r}: {', '.join(unknown)} not among this deployment's "
               f"faults ({', '.join(known)})")
        raise SystemExit(msg)
    return [(name, known[name]) for name in wanted]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--deployment", choices=DEPLOYMENTS, default="single")
    parser.add_argument("--faults", default="",
                        help="the faults to make, in turn (default: all the deployment's)")
    parser.add_argument("--warmup", type=float, default=20.0,
                        help="seconds of load before the first fault")
    parser.add_argument("--cooldown", type=float, default=25.0,
                        help="seconds of load after the last fault")
    parser.add_argument("--minutes", type=float, default=3.0)
    parser.add_argument("--every", type=float, default=20.0,
                        help="seconds between two faults")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--pause", type=float, default=0.01)
    parser.add_argument("--seed", type=int, default=7)
    return asyncio.run(chaos(parser.parse_args()))


if __name__ == "__main__":
    raise SystemExit(main())

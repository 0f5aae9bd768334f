"""Decisions per second: ratelimit_mw's engine beside the `limits` package, in one run.

    python benchmarks/engine.py [--seconds 1.5] [--redis redis://127.0.0.1:6379/0]
    PYTHONPATH=build/compiled python benchmarks/engine.py   # the compiled build

The header line says which build of ratelimit_mw was measured (``scripts/compile``
makes the compiled one).

Memory: one task deciding in a loop. Redis: 50 concurrent tasks on one client.
Keys rotate over 10 000 identities with a roomy limit, so most requests are admitted,
as in production. Ratios compare the same algorithm on the same storage kind.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import limits
import limits.aio.storage as limits_storage
import limits.aio.strategies as limits_strategies
import redis.asyncio as aioredis
from redis_count import ClientCommands  # benchmarks/ is on sys.path when run as a script

from ratelimit_mw import Hit, Limit, MemoryStorage, RedisStorage
from ratelimit_mw.limits import ALGORITHM_NAMES

PEERS = {  # our algorithm -> the limits strategy that does the same work
    "fixed_window": limits_strategies.FixedWindowRateLimiter,
    "sliding_log": limits_strategies.MovingWindowRateLimiter,
    "sliding_window": limits_strategies.SlidingWindowCounterRateLimiter,
}
KEYS = [f"client-{i}" for i in range(10_000)]
RATE = "1000/minute"


def our_limit(algorithm: str, rate: str = RATE) -> Limit:
    burst = int(rate.split("/")[0]) if algorithm in ("token_bucket", "gcra") else None
    return Limit(rate, algorithm, burst=burst)


def three_limits() -> list[Hit]:
    """A burst bucket, a daily window and an hourly sliding window, as a tier would have."""
    return [Hit(our_limit("token_bucket", "10/minute")), Hit(our_limit("fixed_window", "1000/day")),
            Hit(our_limit("sliding_window", "100/hour"))]


async def rate_of(step: Callable[[str], Awaitable[Any]], seconds: float, tasks: int = 1) -> float:
    """Decisions per second of ``step(key)`` run by ``tasks`` concurrent loops."""
    keys = itertools.cycle(KEYS)
    for _ in range(200):  # warm up (script load, connections)
        await step(next(keys))
    done = 0
    deadline = time.perf_counter() + seconds

    async def loop() -> None:
        nonlocal done
        while time.perf_counter() < deadline:
            for _ in range(50):
                await step(next(keys))
            done += 50

    start = time.perf_counter()
    await asyncio.gather(*(loop() for _ in range(tasks)))
    return done / (time.perf_counter() - start)


def row(label: str, ours: float, peer: float | None) -> str:
    ratio = f"{ours / peer:5.2f}x" if peer else "    -"
    theirs = f"{peer:>10,.0f}" if peer else f"{'-':>10}"
    return f"| {label:<34} | {ours:>10,.0f} | {theirs} | {ratio} |"


async def memory_table(seconds: float) -> list[str]:
    lines = []
    for algorithm in ALGORITHM_NAMES:
        storage = MemoryStorage()
        hits = [Hit(our_limit(algorithm))]
        ours = await rate_of(lambda key, s=storage, h=hits: s.decide(key, h), seconds)
        peer = None
        if algorithm in PEERS:
            limiter = PEERS[algorithm](limits_storage.MemoryStorage())
            item = limits.parse(RATE)
            peer = await rate_of(lambda key, lim=limiter, i=item: lim.hit(i, key), seconds)
        lines.append(row(f"memory {algorithm}", ours, peer))
    storage = MemoryStorage()
    three = three_limits()
    ours = await rate_of(lambda key: storage.decide(key, three), seconds)
    lines.append(row("memory, three limits per decision", ours, None))
    return lines


async def redis_table(url: str, seconds: float) -> list[str]:
    lines = []
    prefix = f"bench:{uuid.uuid4().hex[:8]}:"
    client = aioredis.Redis.from_url(url, max_connections=64)
    storage = RedisStorage(client, prefix=prefix)
    for algorithm in ALGORITHM_NAMES:
        hits = [Hit(our_limit(algorithm))]
        ours = await rate_of(lambda key, h=hits: storage.decide(key, h), seconds, tasks=50)
        peer = None
        if algorithm in PEERS:
            peer_storage = limits_storage.RedisStorage(
                url.replace("redis://", "async+redis://", 1),
                key_prefix=f"{prefix}peer-{algorithm}",
                implementation="redispy", max_connections=64)
            limiter = PEERS[algorithm](peer_storage)
            item = limits.parse(RATE)
            peer = await rate_of(lambda key, lim=limiter, i=item: lim.hit(i, key), seconds,
                                 tasks=50)
        lines.append(row(f"redis {algorithm} (50 tasks)", ours, peer))
    three = three_limits()
    ours = await rate_of(lambda key: storage.decide(key, three), seconds, tasks=50)
    lines.append(row("redis, three limits per decision", ours, None))

    sha = await client.script_load("return 1")
    bare = await rate_of(lambda key: client.evalsha(sha, 1, key), seconds, tasks=50)
    lines.append(row("bare redis-py EVALSHA (baseline)", bare, None))

    before = (await client.info("commandstats")).get("cmdstat_evalsha", {}).get("calls", 0)
    with ClientCommands(url) as sent:
        for i in range(1000):
            await storage.decide(f"count-{i % 10}", three)
    after = (await client.info("commandstats")).get("cmdstat_evalsha", {}).get("calls", 0)
    lines.append(f"\nRedis commands per decision with three limits: "
                 f"{sum(sent.counts.values()) / 1000:g} sent by the client "
                 f"({', '.join(sorted(sent.counts))}), "
                 f"{(after - before) / 1000:g} EVALSHA counted by the server")
    names = [name async for name in client.scan_iter(match=prefix + "*", count=1000)]
    for start in range(0, len(names), 1000):
        await client.delete(*names[start:start + 1000])
    await client.aclose()
    return lines


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=1.5)
    parser.add_argument("--redis", default="redis://127.0.0.1:6379/0")
    parser.add_argument("--no-redis", action="store_true")
    args = parser.parse_args()
    import ratelimit_mw.storage.memory as memory_module

    build = "compiled" if memory_module.__file__.endswith((".so", ".pyd")) else "source"
    print(f"ratelimit_mw ({build}) engine vs limits {limits.__version__} "
          f"(decisions/s, {args.seconds:g} s per cell)\n")
    print(f"| {'case':<34} | {'ours':>10} | {'limits':>10} | ratio |")
    print(f"|{'-' * 36}|{'-' * 12}|{'-' * 12}|-------|")
    for line in await memory_table(args.seconds):
        print(line, flush=True)
    if not args.no_redis:
        for line in await redis_table(args.redis, args.seconds):
            print(line, flush=True)


if __name__ == "__main__":
    asyncio.run(main())

"""Redis time per decision: how many decisions one Redis core (or Cluster shard) can make.

    python benchmarks/redis_time.py [--decisions 10000] [--runs 3] [--no-cluster]
    python benchmarks/redis_time.py --callgrind --decisions 2000 --runs 1 [--identities 100]

Starts its own redis-server (a standalone one, then a 3-primary Cluster) on free
loopback ports, and for each case runs ``--decisions`` decisions over 10 000
identities (``--identities``: fewer make each a returning caller, whose windows are
open) from 10 concurrent tasks, with a roomy limit (most are admitted, as in
production). Redis time is ``INFO commandstats`` ``usec`` after ``CONFIG RESETSTAT``,
summed over the commands the client sent (a script's own commands are inside its
time) and over every primary; "run" counts every command Redis ran, a script's
included, "sent" those the client sent. Each figure is the median of ``--runs`` runs.
The floor is a minimal fixed-window script (``INCR``, ``PEXPIRE`` on the first hit);
the guarantees' floors (``floor.lua``) do only what each decision needs with windows on
Redis's clock and every limit read before any is written; "strings" is our library
with a fixed window's and a token bucket's state one string (see ``redis_floor.py``).
With ``--callgrind`` the server runs under valgrind and the figure is thousands of
instructions run inside the commands sent, per decision: slower, but the same from run
to run on a busy machine, where µs are not.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import statistics
import subprocess
import sys
import tempfile
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import limits
import limits.aio.strategies as limits_strategies
import limits.storage
import redis.asyncio as aioredis
from redis_count import ClientCommands  # benchmarks/ is on sys.path when run as a script
from redis_floor import (
    GUARANTEE_FLOORS,
    STRING_STATE_CASES,
    floor_step,
    guarantees_floor_library,
    string_state_library,
    string_state_step,
)

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from ratelimit_mw import Hit, Limit, RedisStorage
from ratelimit_mw.storage import storage_from_url
from ratelimit_mw.storage.scripts import decide_library
from tests.redis_servers import (
    ClusterDeployment,
    RedisProcess,
    redis_server_binary,
)

KEYS = [f"client-{i}" for i in range(10_000)]
TASKS = 10
RATE = "1000000/minute"
FLOOR = ("local c = redis.call('INCR', KEYS[1]) "
         "if c == 1 then redis.call('PEXPIRE', KEYS[1], 60000) end return c")
FLOOR_LIBRARY = ("#!lua name=bench_floor\n"
                 "redis.register_function('bench_floor', function(keys, args) " +
                 FLOOR.replace("KEYS", "keys") + " end)")
PEERS = {  # our algorithm -> the limits strategy that does the same work
    "fixed_window": limits_strategies.FixedWindowRateLimiter,
    "sliding_log": limits_strategies.MovingWindowRateLimiter,
    "sliding_window": limits_strategies.SlidingWindowCounterRateLimiter,
}
_COLLECTED = ("fcallCommand", "evalShaCommand", "zremCommand")  # what clients send
_NOT_COUNTED = {"config", "info", "cluster", "ping", "hello", "client", "echo", "command",
                "script", "function", "monitor", "select", "readonly"}


def our_limit(algorithm: str, rate: str = RATE) -> Limit:
    burst = int(rate.split("/")[0]) if algorithm in ("token_bucket", "gcra") else None
    return Limit(rate, algorithm, burst=burst)


def cases() -> list[tuple[str, list[Hit], int]]:
    """(label, hits, usage units) of each decision measured."""
    alone = [(algorithm, [Hit(our_limit(algorithm))], 0) for algorithm in (
        "fixed_window", "sliding_log", "sliding_window", "token_bucket", "gcra")]
    alone.append(("calendar_month", [Hit(Limit.monthly(10_000_000))], 0))
    three = [Hit(our_limit("token_bucket", "1000/minute")),
             Hit(our_limit("fixed_window", "500000/day")),
             Hit(our_limit("fixed_window", "100000/hour"))]
    # The example app's pro tier: a burst bucket, a daily window, 50 slots in flight.
    tier = [Hit(Limit("1000/minute", "token_bucket", burst=2000)),
            Hit(Limit("500000/day", "fixed_window")), Hit(Limit.concurrency(50))]
    return [*alone, ("three limits (bucket + day + hour)", three, 0),
            ("tier: bucket + day + 50-slot concurrency", tier, 0),
            ("the same tier with usage history", tier, 1)]


class Servers:
    """The primaries of one deployment: reset and read their command statistics (and,
    for a server under callgrind, the instructions it ran inside commands sent)."""

    def __init__(self, nodes: list[RedisProcess], callgrind: Path | None = None) -> None:
        self.nodes = nodes
        self.callgrind = callgrind  # where a server under callgrind writes its dumps

    def reset(self) -> None:
        for node in self.nodes:
            node.call("CONFIG", "RESETSTAT")
            if self.callgrind is not None:
                subprocess.run(["callgrind_control", "-z", str(node.pid)], check=True,
                               capture_output=True)

    def instructions(self) -> int:
        """Instructions run inside the commands sent since ``reset`` (callgrind only)."""
        assert self.callgrind is not None
        total = 0
        for node in self.nodes:
            for dump in self.callgrind.glob("cg.out.*"):
                dump.unlink()
            subprocess.run(["callgrind_control", "-d", str(node.pid)], check=True,
                           capture_output=True)
            for dump in self.callgrind.glob("cg.out.*"):
                for line in dump.read_text().splitlines():
                    if line.startswith(("summary:", "totals:")):
                        total += int(line.split()[1])
                        break
        return total

    def stats(self) -> dict[str, tuple[int, int]]:
        """Per command (lower case, subcommands joined by ``|``): (calls, usec)."""
        total: Counter[str] = Counter()
        usec: Counter[str] = Counter()
        for node in self.nodes:
            for name, row in node.info("commandstats").items():
                command = name.removeprefix("cmdstat_")
                total[command] += int(row["calls"])
                usec[command] += int(row["usec"])
        return {name: (total[name], usec[name]) for name in total}


async def run_many(step: Callable[[str], Awaitable[Any]], count: int) -> None:
    """``count`` calls of ``step(key)`` from ``TASKS`` concurrent loops over ``KEYS``."""
    keys = itertools.cycle(KEYS)
    left = count

    async def loop() -> None:
        nonlocal left
        while left > 0:
            left -= 1
            await step(next(keys))

    await asyncio.gather(*(loop() for _ in range(TASKS)))


async def measure(servers: Servers, sent_names: set[str], count: int,
                  step: Callable[[str], Awaitable[Any]],
                  before: Callable[[], Awaitable[Any]] | None = None) -> tuple[float, float]:
    """(µs of Redis time, commands run) per call of ``step``, counting as Redis time the
    commands named ``sent_names`` (those the client sends)."""
    if before is not None:
        await before()
    servers.reset()
    await run_many(step, count)
    stats = servers.stats()
    usec = (servers.instructions() / 1000 if servers.callgrind is not None else
            sum(u for name, (_, u) in stats.items() if name in sent_names))
    run = sum(c for name, (c, _) in stats.items() if name.split("|")[0] not in _NOT_COUNTED)
    return usec / count, run / count


async def sent_by(url: str, step: Callable[[str], Awaitable[Any]]) -> Counter[str]:
    """The commands (name -> count) the client sends for 100 calls of ``step``."""
    with ClientCommands(url) as sent:
        for key in KEYS[:100]:
            await step(key)
    return sent.counts


async def table(name: str, url: str, servers: Servers, monitor_url: str | None,
                count: int, runs: int) -> list[tuple[str, str, float, float, float]]:
    """Rows (case, who, µs per decision, commands run, commands sent) of one deployment."""
    rows = []
    prefix = f"bench:{uuid.uuid4().hex[:8]}:"
    storage = storage_from_url(url, prefix=prefix)
    assert isinstance(storage, RedisStorage)
    await storage.prepare()
    ours_sent = {"evalsha", "fcall"}
    unit = "µs" if servers.callgrind is None else "k instructions"

    async def median(who: str, label: str, sent: set[str], sent_count: float,
                     step: Callable[[str], Awaitable[Any]],
                     before: Callable[[], Awaitable[Any]] | None = None) -> None:
        await run_many(step, 500)  # warm up: connections, scripts
        results = [await measure(servers, sent, count, step, before) for _ in range(runs)]
        usec = statistics.median(r[0] for r in results)
        run = statistics.median(r[1] for r in results)
        rows.append((label, who, usec, run, sent_count))
        print(f"  {name:<10} {who:<8} {label:<42} {usec:6.2f} {unit}  {run:5.2f} run  "
              f"{sent_count:g} sent", flush=True)

    for case, (label, hits, usage) in enumerate(cases()):
        async def decide(key: str, h: list[Hit] = hits, u: int = usage) -> Any:
            verdict = await storage.decide(key, h, usage=u)
            if verdict.leases:
                await storage.release(verdict.leases)
            return verdict

        async def decide_only(key: str, h: list[Hit] = hits, u: int = usage) -> Any:
            return await storage.decide(key, h, usage=u)

        sent = await _sent_count(monitor_url, decide_only, ours_sent, case)
        await median("ours", label, ours_sent, sent, decide if _has_slot(hits) else decide_only)
        if _has_slot(hits) and usage:
            usec, run = await release_time(storage, servers, hits, usage, count, runs)
            rows.append(("release of the slot (ZREM)", "ours", usec, run, 1))
            print(f"  {name:<10} ours     {'release of the slot (ZREM)':<42} {usec:6.2f} {unit}",
                  flush=True)
        algorithm = hits[0].limit.algorithm
        if len(hits) == 1 and algorithm in PEERS:
            peer_url = url.replace("redis://", "async+redis://", 1).replace(
                "redis+cluster://", "async+redis+cluster://", 1)
            peer_storage = limits.storage.storage_from_string(
                peer_url, key_prefix=f"{prefix}peer{case}", implementation="redispy")
            limiter = PEERS[algorithm](peer_storage)
            item = limits.parse(RATE)

            async def peer(key: str, lim: Any = limiter, i: Any = item) -> Any:
                return await lim.hit(i, key)

            peer_sent = await _sent_names(monitor_url, peer, {"evalsha"}, 100 + case)
            await median("limits", label, set(peer_sent), sum(peer_sent.values()) / 100, peer)
            # limits' storages have no close: their redis-py client is closed here.
            await peer_storage.bridge.get_connection().aclose()
    await storage.close()

    first = url.split("://", 1)[1].split(",", 1)[0]  # a Cluster learns the others from one
    client: Any = (aioredis.RedisCluster.from_url(f"redis://{first}")
                   if "+cluster" in url else aioredis.Redis.from_url(url))
    sha = await client.script_load(FLOOR)
    await client.function_load(FLOOR_LIBRARY, replace=True)

    async def floor_evalsha(key: str) -> Any:
        return await client.evalsha(sha, 1, f"{prefix}floor:{key}")

    async def floor_fcall(key: str) -> Any:
        return await client.fcall("bench_floor", 1, f"{prefix}floorf:{key}")

    await median("floor", "fixed window: INCR + PEXPIRE, EVALSHA", {"evalsha"}, 1, floor_evalsha)
    await median("floor", "fixed window: INCR + PEXPIRE, FCALL", {"fcall"}, 1, floor_fcall)
    await guarantee_floors(client, servers, prefix, median)
    await client.aclose()
    return rows


async def guarantee_floors(client: Any, servers: Servers, prefix: str,
                           median: Callable[..., Awaitable[None]]) -> None:
    """Rows of the guarantees' floors, then of our library with string state."""
    await client.function_load(guarantees_floor_library(), replace=True)
    for label, function, keys, slot in GUARANTEE_FLOORS:
        await median("floor", label, {"fcall"}, 1, floor_step(client, function, prefix, keys, slot))
    # Ours goes, so that the Lua VM holds one decision library, as it did for ours.
    for node in servers.nodes:
        node.call("FUNCTION", "DELETE", decide_library().name)
    strings = string_state_library()
    await client.function_load(strings.source, replace=True)
    for label, hits, _ in cases():
        if label in STRING_STATE_CASES:
            step = string_state_step(client, strings.function, f"{prefix}s:", hits)
            await median("strings", label, {"fcall"}, 1, step)


async def release_time(storage: RedisStorage, servers: Servers, hits: list[Hit], usage: int,
                       count: int, runs: int) -> tuple[float, float]:
    """(µs of Redis time, commands run) per slot given back: ``count`` slots taken, then
    given back from ``TASKS`` concurrent loops, median of ``runs``."""
    results = []
    for run in range(runs + 1):  # the first warms up
        leases = [lease for key in KEYS[:count]
                  for lease in (await storage.decide(key, hits, usage=usage)).leases]

        async def release(key: str, leases: list[Any] = leases) -> None:
            await storage.release([leases.pop()])

        servers.reset()
        given = len(leases)
        await run_many(release, given)
        calls, usec = servers.stats().get("zrem", (0, 0))
        if servers.callgrind is not None:
            usec = servers.instructions() // 1000
        if run:
            results.append((usec / given, calls / given))
    return statistics.median(r[0] for r in results), statistics.median(r[1] for r in results)


def _has_slot(hits: list[Hit]) -> bool:
    return any(hit.limit.is_concurrency for hit in hits)


_SENT: dict[int, Counter[str]] = {}  # what each step sent on the standalone server


async def _sent_names(monitor_url: str | None, step: Callable[[str], Awaitable[Any]],
                      default: set[str], case: int = 0) -> Counter[str]:
    """What ``step`` sends per 100 calls: watched on the standalone server, taken from
    there (or ``default``) on a Cluster, where MONITOR would see one node."""
    if monitor_url is None:
        return _SENT.get(case) or Counter(dict.fromkeys(default, 100))
    _SENT[case] = await sent_by(monitor_url, step)
    return _SENT[case]


async def _sent_count(monitor_url: str | None, step: Callable[[str], Awaitable[Any]],
                      default: set[str], case: int) -> float:
    return sum((await _sent_names(monitor_url, step, default, case)).values()) / 100


def markdown(rows: dict[str, list[tuple[str, str, float, float, float]]], unit: str) -> str:
    lines = [f"| decision | deployment | who | {unit} | commands run | commands sent |",
             "|---|---|---|---:|---:|---:|"]
    for deployment, found in rows.items():
        for label, who, usec, run, sent in found:
            lines.append(f"| {label} | {deployment} | {who} | {usec:.2f} | {run:.2f} | {sent:g} |")
    return "\n".join(lines)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--decisions", type=int, default=10_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--no-cluster", action="store_true")
    parser.add_argument("--identities", type=int, default=len(KEYS),
                        help="how many callers the decisions go round (default: %(default)s)")
    parser.add_argument("--callgrind", action="store_true",
                        help="count the instructions redis-server runs per decision (in "
                             "thousands, in place of µs) under valgrind; standalone only")
    args = parser.parse_args()
    KEYS[:] = [f"client-{i}" for i in range(args.identities)]
    server = redis_server_binary()
    results: dict[str, list[tuple[str, str, float, float, float]]] = {}
    with tempfile.TemporaryDirectory(prefix="redis-time-") as workdir:
        valgrind = ["valgrind", "--tool=callgrind", "--collect-atstart=no",
                    *(f"--toggle-collect={name}" for name in _COLLECTED),
                    f"--callgrind-out-file={workdir}/cg.out.%p"] if args.callgrind else []
        node = RedisProcess("standalone", Path(workdir), lambda w, port: [
            *valgrind, server, "--port", str(port), "--bind", "127.0.0.1", "--dir", str(w),
            "--save", "", "--appendonly", "no"])
        node.start(timeout=60)
        try:
            url = f"redis://127.0.0.1:{node.port}/0"
            print(f"redis-server {node.info('server')['redis_version']}, limits "
                  f"{limits.__version__}; {args.decisions} decisions per run, median of "
                  f"{args.runs}", flush=True)
            servers = Servers([node], Path(workdir) if args.callgrind else None)
            results["Redis"] = await table("Redis", url, servers, url, args.decisions, args.runs)
        finally:
            node.kill()
        if not args.no_cluster and not args.callgrind:
            cluster_dir = Path(workdir) / "cluster"
            cluster_dir.mkdir()
            cluster = ClusterDeployment(cluster_dir)
            cluster.start()
            try:
                results["Cluster"] = await table("Cluster", cluster.url, Servers(cluster.nodes),
                                                 None, args.decisions, args.runs)
            finally:
                cluster.stop()
    print()
    print(markdown(results, "k instructions (callgrind)" if args.callgrind else
                   "µs of Redis time"))


if __name__ == "__main__":
    asyncio.run(main())

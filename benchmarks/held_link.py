"""A link to Redis that holds for 30 s under a steady load: the worker stays flat.

The app (``open`` mode, 250 ms storage timeout, as in ``test_network_faults``) runs
in this process behind the fault proxy (``tests/faults_proxy.py``), under ten callers
sending one request after the other. After 10 s of normal service the link stops
forwarding (both sockets open) for ``--hold`` seconds, then forwards again. Every
second it prints the requests served, the slowest, the decisions waiting on the
storage (``GuardedStorage.pending``) and the process's RSS; then whether pending and
RSS stayed flat through the hold, and how soon Redis decided again.

    python benchmarks/held_link.py [--hold 30]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.soak import _rss_mb  # noqa: E402
from tests.reliability.test_network_faults import (  # noqa: E402
    CALLERS,
    _redis_behind_proxy,
    _running,
)


async def held(seconds: float) -> int:
    with _redis_behind_proxy() as proxy:
        async with _running(proxy) as run:
            pending = run.middleware.limiter.guarded
            pid = os.getpid()
            samples: list[tuple[float, int, float]] = []  # (time, most pending, RSS)

            async def second(label: str) -> None:
                run.most_pending = 0
                waits = await run.load(1.0)
                run.waits.clear()  # kept by the tests; here they would be the growth seen
                samples.append((time.monotonic(), run.most_pending, _rss_mb(pid)))
                print(f"{label:>6} {len(waits):6d} requests, slowest "
                      f"{max(w for w, _ in waits) * 1000:6.1f} ms, most pending "
                      f"{run.most_pending:4d} (now {pending.pending}), RSS "
                      f"{samples[-1][2]:6.1f} MB", flush=True)

            for _ in range(10):
                await second("before")
            proxy.hold()
            during = len(samples)
            for _ in range(int(seconds)):
                await second("held")
            proxy.clear()
            back = await run.until_redis_decides()
            for _ in range(5):
                await second("after")
    held_samples = samples[during:during + int(seconds)]
    first_rss, last_rss = held_samples[0][2], held_samples[-1][2]
    most = max(sample[1] for sample in held_samples)
    flat = most <= CALLERS and last_rss <= first_rss * 1.05 + 5
    print(f"held {seconds:g} s: most pending {most} (callers {CALLERS}), RSS "
          f"{first_rss:.1f} -> {last_rss:.1f} MB; Redis decided again {back:.2f} s after "
          f"the link came back; {run.stats}")
    print("verdict: flat" if flat else "verdict: GREW")
    return 0 if flat else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hold", type=float, default=30.0)
    return asyncio.run(held(parser.parse_args().hold))


if __name__ == "__main__":
    raise SystemExit(main())

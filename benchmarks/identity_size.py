"""Bytes per identity held by the memory storage: one limit of each algorithm, and a
three-limit tier with a concurrency slot.

For each case a fresh process decides once for each of ``--identities`` identities and
reports the growth of its resident memory divided by their number ("storage's own":
the keys' strings were made before and are not counted), then the same plus the
average size of a key string ("with its key": a storage keeps the first key string it
was given for each identity; keys here are as ``ClientIP`` makes them,
``ip:198.51.x.y``). Run from a folder where the build you mean comes first on the
path, e.g. ``PYTHONPATH=build/compiled`` for the compiled one:

    python benchmarks/identity_size.py [--identities 300000]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys

CASES = {
    "one sliding window (the default)": ("100/hour", "sliding_window"),
    "one fixed window": ("100/hour", "fixed_window"),
    "one token bucket": ("100/hour", "token_bucket"),
    "one GCRA": ("100/hour", "gcra"),
    "tier: token bucket, fixed window (day), sliding window (route), slot": None,
}


def _rss() -> int:
    with open("/proc/self/statm", encoding="ascii") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _measure(case: str, identities: int) -> dict[str, object]:
    """Run in the child: decide once per identity (a tier's slot taken and given back,
    as between two requests), with the limits long made (as at start-up). Rates are
    per hour so that nothing expires, and is reclaimed, within the run."""
    import asyncio

    import ratelimit_mw.storage.memory as memory
    from ratelimit_mw import Hit, Limit, MemoryStorage

    shape = CASES[case]
    if shape is None:
        hits = [Hit(Limit("1000/hour", "token_bucket", burst=200)),
                Hit(Limit("50000/day", "fixed_window")),
                Hit(Limit("20/second", "sliding_window"), 1, "/api/v1/search"),
                Hit(Limit("10/minute", "concurrency"))]
    else:
        hits = [Hit(Limit(*shape))]
    storage = MemoryStorage(max_keys=2 * identities)
    keys = [f"ip:198.51.{n // 250}.{n % 250}" for n in range(identities)]
    gc.collect()
    before = _rss()
    for key in keys:
        verdict = storage.decide_now(key, hits)
        if verdict.leases:
            asyncio.run(storage.release(verdict.leases))
    gc.collect()
    own = (_rss() - before) / identities
    key_bytes = sum(sys.getsizeof(key) for key in keys) / identities
    return {"case": case, "own": own, "with_key": own + key_bytes,
            "compiled": not memory.__file__.endswith(".py"), "held": len(storage)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--identities", type=int, default=300_000)
    parser.add_argument("--case", help=argparse.SUPPRESS)  # the child's
    args = parser.parse_args()
    if args.case:
        print(json.dumps(_measure(args.case, args.identities)))
        return
    rows = []
    for case in CASES:
        out = subprocess.run([sys.executable, __file__, "--identities", str(args.identities),
                              "--case", case], check=True, capture_output=True, text=True)
        rows.append(json.loads(out.stdout))
    build = "compiled" if rows[0]["compiled"] else "source"
    print(f"| case ({build}, {args.identities} identities) | storage's own | with its key |")
    print("|---|---:|---:|")
    for row in rows:
        assert row["held"] == args.identities, row  # none reclaimed: all still counted
        print(f"| {row['case']} | {row['own']:.0f} | {row['with_key']:.0f} |")


if __name__ == "__main__":
    main()

"""A flood of distinct client keys cannot exhaust the in-memory storage."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

pytestmark = [pytest.mark.reliability, pytest.mark.slow]

FLOOD = textwrap.dedent("""
    import asyncio, json, resource
    from ratelimit_mw import Hit, Limit, MemoryStorage

    def rss_mb():
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * resource.getpagesize() / 2**20

    async def main():
        storage = MemoryStorage(max_keys=100_000)
        hits = [Hit(Limit("10/minute", "token_bucket", burst=20)),
                Hit(Limit("1000/day", "fixed_window"))]
        await storage.decide("hot", hits)
        before = rss_mb()
        full = peak = before
        for i in range(1_000_000):
            storage.decide_now(f"flood-{i}", hits)
            if i % 1000 == 0:
                storage.decide_now("hot", hits)  # a client that keeps coming back
            if i == 200_000:
                full = rss_mb()  # max_keys reached long ago: the storage is full
            if i % 100_000 == 0:
                peak = max(peak, rss_mb())
        peak = max(peak, rss_mb())
        hot = storage.decide_now("hot", [Hit(h.limit, 0) for h in hits])
        oldest = storage.decide_now("flood-0", [Hit(h.limit, 0) for h in hits])
        newest = storage.decide_now("flood-999999", [Hit(h.limit, 0) for h in hits])
        print(json.dumps({
            "keys": len(storage), "before_mb": before, "full_mb": full, "peak_mb": peak,
            "hot_remaining": [d.remaining for d in hot.decisions],
            "oldest_remaining": [d.remaining for d in oldest.decisions],
            "newest_remaining": [d.remaining for d in newest.decisions],
        }))

    asyncio.run(main())
""")


def test_a_million_keys_stay_within_max_keys() -> None:
    """1 000 000 distinct keys: memory stays bounded, the oldest go, the hot one stays."""
    out = subprocess.run([sys.executable, "-c", FLOOD], capture_output=True, text=True,
                         timeout=300, check=True)
    report = json.loads(out.stdout)
    assert report["keys"] == 100_000
    # Full at 100 000 identities (about 1 kB each), then flat: 800 000 more keys add
    # nothing but the dict tables settling (measured: +10 MB, then flat to 3 000 000 keys).
    assert report["full_mb"] - report["before_mb"] < 250, report
    assert report["peak_mb"] - report["full_mb"] < 20, report  # (dict tables settle)
    assert report["hot_remaining"][0] < 20 and report["hot_remaining"][1] < 1000, report
    assert report["oldest_remaining"] == [20, 1000], report  # evicted: fresh again
    assert report["newest_remaining"] == [19, 999], report

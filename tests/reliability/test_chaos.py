"""The chaos soak, short: on each deployment, its faults under load, and nothing lost."""

from __future__ import annotations

import subprocess
import sys

import pytest

from .servers import ROOT

pytestmark = [pytest.mark.redis, pytest.mark.reliability, pytest.mark.slow]


def test_a_short_chaos_soak_loses_nothing() -> None:
    """benchmarks/chaos.py for 70 s: Redis killed, frozen and slowed once each under 4
    workers' traffic; no 5xx but closed mode's 503, every slot back, admitted counts
    within the limits, RSS and keys flat."""
    result = subprocess.run(
        [sys.executable, "benchmarks/chaos.py", "--minutes", "1.2", "--every", "9",
         "--concurrency", "8"],
        cwd=ROOT, capture_output=True, text=True, timeout=300, check=False)
    report = "\n".join(line for line in result.stdout.splitlines()
                       if not line.startswith(("ratelimit_mw", "circuit")))
    assert result.returncode == 0, report[-3000:] + result.stderr[-2000:]
    assert "verdict: nothing lost" in report
    assert report.count("Redis for") == 3, report  # kill, freeze, slow


@pytest.mark.parametrize("deployment", ["cluster", "sentinel"])
def test_a_short_chaos_soak_with_failovers_loses_nothing(deployment: str) -> None:
    """benchmarks/chaos.py for 30 s on Cluster (3 primaries with replicas) and Sentinel:
    a failover asked for, then a primary killed and restarted; the same checks."""
    result = subprocess.run(
        [sys.executable, "benchmarks/chaos.py", "--deployment", deployment, "--minutes",
         "0.5", "--every", "7", "--warmup", "8", "--cooldown", "10", "--concurrency", "8"],
        cwd=ROOT, capture_output=True, text=True, timeout=300, check=False)
    report = "\n".join(line for line in result.stdout.splitlines()
                       if not line.startswith(("ratelimit_mw", "circuit")))
    assert result.returncode == 0, report[-3000:] + result.stderr[-2000:]
    assert "verdict: nothing lost" in report
    assert "kill-primary Redis" in report and "failover Redis" in report, report

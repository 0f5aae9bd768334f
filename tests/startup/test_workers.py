"""Several workers on a storage of one process say so: one warning per group of uvicorn
workers, naming what each worker keeps for itself and the fix."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.reliability.servers import uvicorn_server

pytestmark = [pytest.mark.reliability, pytest.mark.slow]

WARNING = "worker processes serve this app on storage 'memory://', which is per process"


def _output(tmp_path: Path, workers: int) -> str:
    log = tmp_path / f"uvicorn-{workers}.log"
    with uvicorn_server({"RATELIMIT_STORAGE_URL": "memory://"}, workers=workers, log=log):
        pass
    return log.read_text(encoding="utf-8", errors="replace")


def test_two_workers_on_memory_warn_once(tmp_path: Path) -> None:
    """2 uvicorn workers: one warning for both, naming the per-process state and the fix."""
    lines = [line for line in _output(tmp_path, 2).splitlines() if WARNING in line]
    assert len(lines) == 1, lines
    line = lines[0]
    assert line.startswith("ratelimit_mw: 2 worker processes")
    for what in ("rate limits", "concurrency slots", "idempotency records",
                 "circuit breakers", "RATELIMIT_STORAGE_URL", "redis://"):
        assert what in line


def test_one_worker_on_memory_is_quiet(tmp_path: Path) -> None:
    """One process: memory storage is exact, nothing to warn about."""
    assert WARNING not in _output(tmp_path, 1)

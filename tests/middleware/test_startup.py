"""A bad configuration stops a real uvicorn at start-up (run with --lifespan on, as the
README, scripts/run-example, the Dockerfile and docker-compose.yml say)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import free_port

APP = '''
from starlette.applications import Starlette
from ratelimit_mw import RateLimitMiddleware, Tier

app = Starlette()
app.add_middleware(RateLimitMiddleware, tiers=[Tier("free", "10/minute")],
                   tier_resolver=lambda scope: "free", cost_of_nothing=1)
'''


@pytest.mark.slow
def test_a_bad_option_stops_uvicorn_with_lifespan_on(tmp_path: Path) -> None:
    """Starlette builds the middleware at the lifespan's start: the error is the
    server's start-up failure, named, and it exits (no server answering 500s)."""
    (tmp_path / "badapp.py").write_text(APP)
    done = subprocess.run(
        [sys.executable, "-m", "uvicorn", "badapp:app", "--lifespan", "on",
         "--port", str(free_port()), "--host", "127.0.0.1"],
        cwd=tmp_path, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode != 0
    assert "cost_of_nothing" in done.stderr
    assert "Application startup failed" in done.stderr

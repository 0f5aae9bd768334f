"""Starlette's TestClient drives the middleware on the HTTP library Starlette asks for."""

from __future__ import annotations

import subprocess
import sys

import httpx2
import starlette
from packaging.version import Version
from starlette.testclient import TestClient

from ratelimit_mw import MemoryStorage
from ratelimit_mw.tiers import Tier
from tests.conftest import FakeClock

from .conftest import make_app


def test_starlettes_test_client_imports_without_a_warning() -> None:
    """With httpx2 installed, as the dev extra has it, Starlette's TestClient raises no
    deprecation warning (from 1.2 it warns when it must fall back to httpx)."""
    # Starlette before 1.7 names an alias anyio deprecates, which pytest's config ignores.
    ignored = "ignore:The anyio.abc.BlockingPortal alias is deprecated:DeprecationWarning"
    run = subprocess.run(
        [sys.executable, "-W", "error", "-W", ignored, "-c", "import starlette.testclient"],
        capture_output=True, text=True, timeout=60, check=False)
    assert run.returncode == 0, run.stderr
    if Version(starlette.__version__) >= Version("1.2"):  # before, it is built on httpx
        assert issubclass(TestClient, httpx2.Client)


def test_the_test_client_sees_limits_and_headers(memory: MemoryStorage, clock: FakeClock) -> None:
    """Requests through a TestClient are counted like any client's: two pass, the third
    gets a 429 with Retry-After."""
    app = make_app(tiers=[Tier("t", "2/minute")], storage=memory, clock=clock)
    with TestClient(app) as client:
        statuses = [client.get("/").status_code for _ in range(3)]
        refused = client.get("/")
    assert statuses == [200, 200, 429]
    assert refused.status_code == 429
    assert int(refused.headers["retry-after"]) >= 1

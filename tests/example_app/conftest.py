"""The example app as a real uvicorn subprocess, on memory or on the test Redis."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import httpx
import pytest

from tests.conftest import free_port

ROOT = Path(__file__).resolve().parents[2]


class ExampleServer:
    """``uvicorn example_app.main:app`` in a session of its own (so a supervisor and its
    workers can all be killed), on a free loopback port."""

    def __init__(self, env: dict[str, str], *, workers: int = 1,
                 command: Sequence[str] | None = None, args: Sequence[str] = ()) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("RATELIMIT_")}
        self.env.update(env)
        self.command = list(command) if command is not None else [
            sys.executable, "-m", "uvicorn", "example_app.main:app", "--host", "127.0.0.1",
            "--port", str(self.port), "--log-level", "warning",
            *(["--workers", str(workers)] if workers > 1 else []), *args]
        self.log = tempfile.NamedTemporaryFile(prefix="example-app-", suffix=".log")  # noqa: SIM115
        self.proc: subprocess.Popen[bytes] | None = None
        self.workers = workers

    def start(self, timeout: float = 30.0) -> ExampleServer:
        """Start the server; return once every worker has answered ``/health``."""
        self.proc = subprocess.Popen(self.command, cwd=ROOT, env=self.env, stdout=self.log,
                                     stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + timeout
        pids: set[int] = set()
        while len(pids) < self.workers:
            if self.proc.poll() is not None:
                pytest.fail(f"the example app exited:\n{self.output()}")
            if time.monotonic() > deadline:
                self.stop()
                pytest.fail(f"the example app did not start {self.workers} worker(s) "
                            f"(saw {len(pids)}):\n{self.output()}")
            try:
                # A new connection each time, so the kernel may hand it to any worker.
                response = httpx.get(f"{self.url}/health", timeout=1,
                                     headers={"connection": "close"})
                if response.status_code == 200:
                    pids.add(response.json()["worker"])
                    continue
            except httpx.TransportError:
                pass
            time.sleep(0.05)
        return self

    def kill_hard(self) -> None:
        """SIGKILL the server process (a worker killed mid-request), no cleanup run."""
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait(timeout=10)

    def stop(self) -> None:
        """Kill the process group this server started (supervisor and workers)."""
        if self.proc is None:
            return
        with contextlib.suppress(ProcessLookupError):  # the group we started, nothing else
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=10)
        self.proc = None

    def output(self) -> str:
        self.log.flush()
        return Path(self.log.name).read_text(errors="replace")[-4000:]

    def close(self) -> None:
        self.stop()
        self.log.close()


def env_for(redis_url: str | None, prefix: str | None, **settings: str) -> dict[str, str]:
    """``RATELIMIT_*`` variables for a server on memory, or on Redis at ``redis_url``."""
    env = {f"RATELIMIT_{name.upper()}": value for name, value in settings.items()}
    if redis_url is not None:
        assert prefix is not None
        env["RATELIMIT_STORAGE_URL"] = redis_url
        env["RATELIMIT_STORAGE_PREFIX"] = prefix
    return env


StartServer = Callable[..., ExampleServer]


@pytest.fixture
def start_server(request: pytest.FixtureRequest) -> Iterator[StartServer]:
    """``start_server(kind, workers=1, args=(), **settings)`` -> a started ExampleServer
    (``kind``: ``memory``, ``redis``, ``cluster`` or ``sentinel``; ``args`` for uvicorn);
    all are killed at teardown."""
    servers: list[ExampleServer] = []

    def start(kind: str, *, workers: int = 1, args: Sequence[str] = (),
              **settings: str) -> ExampleServer:
        # Decisions that count exactly across workers must not fail open on a loaded
        # host: a decision past the default 50 ms is made by the failure policy.
        settings.setdefault("storage_timeout", "5")
        redis_url = prefix = None
        if kind != "memory":
            fixture = "redis_url" if kind == "redis" else f"redis_{kind}_url"
            redis_url = request.getfixturevalue(fixture)
            prefix = request.getfixturevalue("redis_prefix")
        server = ExampleServer(env_for(redis_url, prefix, **settings), workers=workers,
                               args=args)
        servers.append(server)
        return server.start()

    yield start
    for server in servers:
        server.close()


@pytest.fixture(params=["memory", pytest.param("redis", marks=pytest.mark.redis)])
def kind(request: pytest.FixtureRequest) -> str:
    """Each test runs on in-memory storage and on Redis."""
    return str(request.param)


FREE = {"X-API-Key": "demo-free"}
STARTER = {"X-API-Key": "demo-starter"}
PRO = {"X-API-Key": "demo-pro"}
ENTERPRISE = {"X-API-Key": "demo-enterprise"}

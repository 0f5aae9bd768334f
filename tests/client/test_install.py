"""The client as a user installs it: ``pip install 'ratelimit_mw[client]'`` in a fresh venv."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# Runs inside the fresh venv: a stdlib server answers 429 once, then 200, and the
# client retries through it. It imports nothing the [client] extra does not install.
SCRIPT = """
import importlib.util, sys, threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import ratelimit_mw
from ratelimit_mw.client import RetryPolicy, RetryTransport, set_testing

served = []

class Handler(BaseHTTPRequestHandler):
    def do_GET(self):
        served.append(self.path)
        status = 429 if len(served) == 1 else 200
        body = b"slow down" if status == 429 else b"ok"
        self.send_response(status)
        if status == 429:
            self.send_header("Retry-After", "1")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass

server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
threading.Thread(target=server.serve_forever, daemon=True).start()
set_testing(True)  # the one-second Retry-After passes at once
transport = RetryTransport(policy=RetryPolicy(max_retries=2))
with httpx.Client(transport=transport) as client:
    response = client.get(f"http://127.0.0.1:{server.server_address[1]}/thing")
server.shutdown()
missing = [name for name in ("fastapi", "uvicorn", "pytest") if importlib.util.find_spec(name)]
print(response.status_code, response.text, len(served), ratelimit_mw.__file__, missing)
"""


SERVER_SIDE = ("starlette", "redis", "limits", "pydantic")
"""What the base install brings for the server side, which the client must not load."""


@pytest.fixture(scope="module")
def client_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv with ``ratelimit_mw[client]`` installed by pip, as a user installs
    it: from the build under test (the compiled wheel on the compiled pass, the sources
    otherwise), with the newest releases pip finds of what it needs."""
    tmp_path = tmp_path_factory.mktemp("client")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    wheel = os.environ.get("TEST_WHEEL")
    if wheel:
        target = f"{wheel}[client]"
    else:
        project = tmp_path / "project"  # a copy: pip must not write into the tree
        shutil.copytree(ROOT / "ratelimit_mw", project / "ratelimit_mw",
                        ignore=shutil.ignore_patterns("*.so", "__pycache__"))
        for name in ("pyproject.toml", "README.md"):
            shutil.copy(ROOT / name, project / name)
        target = f"{project}[client]"
    subprocess.run(
        [str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet",
         "--disable-pip-version-check", target],
        check=True, env=_env(), timeout=900,
    )
    return venv


def _env() -> dict[str, str]:
    return {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}


@pytest.mark.slow
def test_the_client_extra_installs_a_client_that_retries(
    client_venv: Path, tmp_path: Path,
) -> None:
    """In a venv with only ``ratelimit_mw[client]`` installed, the client imports and
    retries a 429 until the server answers 200."""
    result = subprocess.run(
        [str(client_venv / "bin" / "python"), "-c", SCRIPT], cwd=tmp_path, env=_env(),
        capture_output=True, text=True, timeout=120, check=False,
    )
    assert result.returncode == 0, result.stderr
    status, text, served, location, missing = result.stdout.split(maxsplit=4)
    assert (status, text, served) == ("200", "ok", "2")
    assert location.startswith(str(client_venv)), location  # the installed copy
    assert missing.strip() == "[]"  # neither FastAPI, uvicorn nor pytest came along


@pytest.mark.slow
def test_the_client_starts_without_the_server_side(client_venv: Path, tmp_path: Path) -> None:
    """``import ratelimit_mw.client`` loads httpx and the client's own modules, none of
    the server side's packages (installed all the same), nor asyncio before an async
    call needs it."""
    code = ("import sys; import ratelimit_mw.client; "
            f"print(*sorted(m for m in {(*SERVER_SIDE, 'fastapi', 'asyncio')!r} "
            "if m in sys.modules))")
    result = subprocess.run([str(client_venv / "bin" / "python"), "-c", code], cwd=tmp_path,
                            env=_env(), capture_output=True, text=True, timeout=60, check=True)
    assert result.stdout.split() == []
    installed = subprocess.run(
        [str(client_venv / "bin" / "python"), "-c",
         f"import importlib.util as u; print(all(u.find_spec(m) for m in {SERVER_SIDE!r}))"],
        env=_env(), capture_output=True, text=True, timeout=60, check=True)
    assert installed.stdout.strip() == "True"

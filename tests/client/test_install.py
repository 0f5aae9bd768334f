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


@pytest.mark.slow
def test_the_client_extra_installs_a_client_that_retries(tmp_path: Path) -> None:
    """In a venv with only ``ratelimit_mw[client]`` installed, the client imports and
    retries a 429 until the server answers 200."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python = str(venv / "bin" / "python")
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    # The sources as pip takes them from a checkout: on the compiled pass, ROOT holds
    # mypyc's extension modules, which a plain (pure-Python) install leaves out.
    project = tmp_path / "project"
    shutil.copytree(ROOT / "ratelimit_mw", project / "ratelimit_mw",
                    ignore=shutil.ignore_patterns("*.so", "__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, project / name)
    subprocess.run(
        [python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
         f"{project}[client]"],
        check=True, env=env, timeout=900,
    )
    result = subprocess.run(
        [python, "-c", SCRIPT], cwd=tmp_path, env=env, capture_output=True, text=True,
        timeout=120, check=False,
    )
    assert result.returncode == 0, result.stderr
    status, text, served, location, missing = result.stdout.split(maxsplit=4)
    assert (status, text, served) == ("200", "ok", "2")
    assert location.startswith(str(venv)), location  # the installed copy, not the tree
    assert missing.strip() == "[]"  # neither FastAPI, uvicorn nor pytest came along

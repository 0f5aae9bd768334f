"""The locked environment: uv.lock is what every install of the project takes, the
Dockerfile's included, and uv itself is pinned to the lock's own version everywhere."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import tarfile
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LOCK = tomllib.loads((ROOT / "uv.lock").read_text())
LOCKED = {package["name"]: package.get("version") for package in LOCK["package"]}
DOCKERFILE = (ROOT / "Dockerfile").read_text()


def _dockerfile_install() -> list[str]:
    """The arguments of the Dockerfile's ``uv sync``."""
    run = re.search(r"^RUN (.*?)(?<!\\)$", DOCKERFILE, re.MULTILINE | re.DOTALL)
    assert run, "the Dockerfile installs nothing"
    commands = run.group(1).replace("\\\n", " ").split("&&")
    sync = next(shlex.split(command) for command in commands if " uv sync " in f" {command} ")
    return sync[sync.index("sync") + 1:]


def test_uv_is_pinned_to_the_locks_version() -> None:
    """The Dockerfile and the release workflow install the uv that made the lock."""
    pins = re.findall(r"uv==([0-9][^\"' ]*)", DOCKERFILE)
    assert pins == [LOCKED["uv"]]
    release = (ROOT / ".github" / "workflows" / "release.yml").read_text()
    assert 'name = "uv"' in release  # it reads the version from uv.lock itself


def test_the_dockerfile_installs_exactly_the_lock() -> None:
    """The image's install refuses a lock out of date with pyproject.toml and takes the
    package with the extras the example app uses, uvicorn, and nothing editable."""
    arguments = _dockerfile_install()
    assert "--locked" in arguments
    assert "--no-editable" in arguments
    extras = {arguments[i + 1] for i, word in enumerate(arguments) if word == "--extra"}
    assert extras == {"fastapi", "prometheus"}


@pytest.mark.slow
def test_the_dockerfiles_install_runs_the_example_app(tmp_path: Path) -> None:
    """The Dockerfile's ``uv sync``, run here on what it copies into the image, makes an
    environment with the lock's versions in which the example app imports."""
    context = tmp_path / "context"
    wheel = os.environ.get("TEST_WHEEL")
    if wheel:  # the compiled pass has no sources in its tree: the sdist beside the wheel
        sdist = next(Path(wheel).parent.glob("ratelimit_mw-*.tar.gz"))
        with tarfile.open(sdist) as archive:
            archive.extractall(tmp_path, filter="data")
        (tmp_path / sdist.name.removesuffix(".tar.gz")).rename(context)
    else:
        context.mkdir()
        for name in ("pyproject.toml", "uv.lock", "README.md"):
            shutil.copy(ROOT / name, context / name)
        shutil.copytree(ROOT / "ratelimit_mw", context / "ratelimit_mw",
                        ignore=shutil.ignore_patterns("*.so", "__pycache__"))
    venv = tmp_path / "venv"
    env = {key: value for key, value in os.environ.items()
           if key not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(UV_PROJECT_ENVIRONMENT=str(venv), UV_PYTHON=sys.executable)
    uv = Path(sys.executable).parent / "uv"
    subprocess.run([str(uv), "sync", "--quiet", *_dockerfile_install()], cwd=context,
                   env=env, check=True, timeout=600)
    app = tmp_path / "app"
    shutil.copytree(ROOT / "example_app", app / "example_app",
                    ignore=shutil.ignore_patterns("__pycache__"))
    python = str(venv / "bin" / "python")
    subprocess.run([python, "-c", "import example_app.main"], cwd=app, env=env,
                   check=True, timeout=120)
    frozen = subprocess.run([str(uv), "pip", "freeze", "--python", python], env=env,
                            capture_output=True, text=True, check=True).stdout
    installed = dict(line.split("==") for line in frozen.splitlines() if "==" in line)
    for name in ("fastapi", "starlette", "redis", "uvicorn", "prometheus-client"):
        assert installed[name] == LOCKED[name], name
    assert "pytest" not in installed and "mypy" not in installed

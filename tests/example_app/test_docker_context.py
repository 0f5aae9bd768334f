"""The Docker build context: what `docker compose build` sends, and what it leaves out."""

from __future__ import annotations

import fnmatch

from .conftest import ROOT


def _ignored(path: str, patterns: list[str]) -> bool:
    """Whether ``path`` is left out by ``.dockerignore``'s patterns (the last match wins;
    a pattern matches a path or anything below it)."""
    ignored = False
    for pattern in patterns:
        keep = pattern.startswith("!")
        pattern = pattern.removeprefix("!").removeprefix("**/")
        parts = path.split("/")
        if any(fnmatch.fnmatch("/".join(parts[i:j]), pattern)
               for i in range(len(parts)) for j in range(i + 1, len(parts) + 1)):
            ignored = not keep
    return ignored


def _patterns() -> list[str]:
    lines = (ROOT / ".dockerignore").read_text().splitlines()
    return [line.strip() for line in lines if line.strip() and not line.startswith("#")]


def test_local_state_stays_out_of_the_build_context() -> None:
    """Virtualenvs, build output, caches and the git history are not sent to Docker."""
    patterns = _patterns()
    for path in (".venv/bin/python", ".git/HEAD", "build/compiled/ratelimit_mw/x.so",
                 "ratelimit_mw/__pycache__/limiter.cpython-311.pyc", ".mypy_cache/3.11/x",
                 ".pytest_cache/v/cache", ".hypothesis/examples/x", "dist/x.whl"):
        assert _ignored(path, patterns), path


def test_what_the_dockerfile_copies_is_sent() -> None:
    """Every path the Dockerfile copies is in the build context."""
    patterns = _patterns()
    copied = [part for line in (ROOT / "Dockerfile").read_text().splitlines()
              if line.startswith("COPY") for part in line.split()[1:-1]]
    assert copied
    for path in copied:
        assert not _ignored(path, patterns), path
        if (ROOT / path).is_dir():
            inside = next((ROOT / path).glob("*.py")).relative_to(ROOT).as_posix()
            assert not _ignored(inside, patterns), inside

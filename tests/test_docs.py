"""The documentation's Python snippets run as pasted, each in a fresh interpreter.

A snippet that names the usual local Redis (``redis://127.0.0.1:6379/0``) runs against
the suite's own instead, so it never touches a server the suite did not start.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
LOCAL_REDIS = "redis://127.0.0.1:6379/0"
_BLOCK = re.compile(r"^```python\n(.*?)^```", re.MULTILINE | re.DOTALL)


def _snippets() -> list[tuple[str, str]]:
    """``(page:line, code)`` of every Python block of the pages."""
    found = []
    for page in PAGES:
        text = page.read_text()
        for match in _BLOCK.finditer(text):
            line = text.count("\n", 0, match.start()) + 1
            found.append((f"{page.relative_to(ROOT)}:{line}", match.group(1)))
    return found


SNIPPETS = _snippets()


def test_there_are_snippets_to_run() -> None:
    """The pages hold Python snippets (a change of fence would otherwise run none)."""
    assert len(SNIPPETS) >= 10


@pytest.mark.slow
@pytest.mark.parametrize(("where", "code"), SNIPPETS, ids=[where for where, _ in SNIPPETS])
def test_the_snippet_runs(where: str, code: str, redis_url: str, tmp_path: Path) -> None:
    """The snippet runs to its end without an error or a warning."""
    result = subprocess.run(
        [sys.executable, "-W", "error", "-c", code.replace(LOCAL_REDIS, redis_url)],
        cwd=tmp_path, capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0, f"{where}:\n{result.stderr[-3000:]}"


def test_the_readme_links_resolve() -> None:
    """Every relative link of the README names a file of the repository."""
    text = (ROOT / "README.md").read_text()
    targets = [t.split("#")[0] for t in re.findall(r"\]\(([^)\s]+)\)", text)]
    local = [t for t in targets if t and "://" not in t]
    assert local, "the README links to nothing of the repository"
    missing = [t for t in local if not (ROOT / t).exists()]
    assert missing == [], f"README links to missing files: {missing}"


def test_the_readme_stays_short() -> None:
    """The README is the first five minutes (about 10 KB); the rest lives in docs/."""
    size = len((ROOT / "README.md").read_bytes())
    assert size <= 12_000, f"README.md is {size} bytes; move detail into a docs/ page"


def test_the_algorithms_table_is_the_registrys() -> None:
    """docs/algorithms.md lists every algorithm of the registry, in its order, with what
    it keeps and when to pick it, as ``ALGORITHMS`` says."""
    from ratelimit_mw.algorithms import ALGORITHMS

    text = (ROOT / "docs" / "algorithms.md").read_text()
    rows = [line.split(" | ") for line in text.splitlines()
            if line.startswith("| `") and line.count(" | ") == 2]
    listed = [(cells[0].removeprefix("| `").split("`")[0], cells[1], cells[2].removesuffix(" |"))
              for cells in rows]
    assert listed == [(a.name, a.state, a.use) for a in ALGORITHMS.values()]

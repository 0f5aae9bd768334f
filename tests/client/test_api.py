"""The public surface of ratelimit_mw.client: names, docs, examples, independence."""

from __future__ import annotations

import ast
import doctest
import importlib
import inspect
import pkgutil
from pathlib import Path

import pytest

import ratelimit_mw.client as client

MODULES = sorted(
    f"ratelimit_mw.client.{info.name}" for info in pkgutil.iter_modules(client.__path__)
)
PACKAGE_DIR = Path(client.__file__).parent


def _isort_style(name: str) -> tuple[int, str]:
    """Ruff's RUF022 order: CONSTANTS, then Classes, then functions."""
    return (0 if name.isupper() else 1 if name[0].isupper() else 2, name)


def test_all_is_sorted_and_complete() -> None:
    """__all__ is sorted and lists exactly the public names of the package."""
    public = {
        name
        for name, value in vars(client).items()
        if not name.startswith("_") and not inspect.ismodule(value) and name != "annotations"
    }
    assert client.__all__ == sorted(public, key=_isort_style)


def test_every_public_object_is_documented() -> None:
    """Every public class and function has a docstring, and so do their public methods."""
    for name in client.__all__:
        obj = getattr(client, name)
        if not (inspect.isclass(obj) or inspect.isfunction(obj)):
            continue
        assert inspect.getdoc(obj), name
        if inspect.isclass(obj):
            for attr, member in vars(obj).items():
                if not attr.startswith("_") and inspect.isfunction(member):
                    assert inspect.getdoc(member), f"{name}.{attr}"


@pytest.mark.parametrize("module", ["ratelimit_mw.client", *MODULES])
def test_docstring_examples_run(module: str) -> None:
    """The examples in the docstrings are correct."""
    result = doctest.testmod(importlib.import_module(module), optionflags=doctest.ELLIPSIS)
    assert result.failed == 0


def test_no_import_from_the_server_side() -> None:
    """The client imports nothing from the rest of ratelimit_mw but the breaker."""
    for path in PACKAGE_DIR.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                module = node.module or ""
                if node.level == 2 and module == "breaker":
                    continue  # the circuit breaker imports no other ratelimit_mw module
                assert node.level <= 1, f"{path.name} reaches outside the client package"
                assert node.level == 1 or not module.startswith("ratelimit_mw"), path.name
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    assert not alias.name.startswith("ratelimit_mw"), path.name

"""The build under test: the sources, or the compiled wheel of ``scripts/compile``.

``scripts/test`` runs the suite twice, the second time with ``TEST_BUILD=compiled``
on the wheel installed into a venv of its own; these tests make sure that run really
imports the compiled modules, from the install (and the first one the sources), and
that what users may subclass still can be.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import os
import tomllib
from pathlib import Path
from typing import Any

import pytest

import ratelimit_mw
from ratelimit_mw import MemoryStorage, RateLimitMiddleware, RateLimitSettings, Tier
from ratelimit_mw.headers import HeaderFormat

ROOT = Path(__file__).resolve().parent.parent
BUILD = os.environ.get("TEST_BUILD", "source")


INSTALLED = Path(ratelimit_mw.__file__).resolve().parent.parent
"""Where the package under test lives: the tree, or the wheel's venv's site-packages."""


def compiled_modules() -> list[str]:
    """The modules the mypyc build hook of pyproject.toml compiles."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    include = config["tool"]["hatch"]["build"]["targets"]["wheel"]["hooks"]["mypyc"]["include"]
    names = []
    for entry in include:
        path = INSTALLED / entry.lstrip("/")
        files = sorted(path.rglob("*.py")) if path.is_dir() else [path]
        names += [".".join(f.relative_to(INSTALLED).with_suffix("").parts) for f in files]
    return [name.removesuffix(".__init__") for name in names]


def test_the_build_hook_names_existing_modules() -> None:
    """Every path the build hook compiles exists (a renamed module would silently fall
    back to Python)."""
    modules = compiled_modules()
    assert "ratelimit_mw.middleware" in modules
    assert "ratelimit_mw.storage.memory" in modules
    for name in modules:
        assert importlib.util.find_spec(name) is not None, name


@pytest.mark.parametrize("name", compiled_modules())
def test_the_run_imports_the_build_it_names(name: str) -> None:
    """TEST_BUILD=compiled: each compiled module is an extension module; else
    the sources."""
    module = importlib.import_module(name)
    compiled = isinstance(module.__loader__, importlib.machinery.ExtensionFileLoader)
    assert compiled == (BUILD == "compiled"), (name, module.__file__)


def test_the_package_says_which_build_it_is() -> None:
    """``ratelimit_mw.compiled`` tells the compiled wheel from the sources; the compiled
    pass imports the package from its install, not from the tree."""
    assert ratelimit_mw.compiled == (BUILD == "compiled")
    if BUILD == "compiled":
        assert not (ROOT / "ratelimit_mw").exists()
        assert "site-packages" in INSTALLED.parts, INSTALLED
    else:
        assert INSTALLED == ROOT


async def _app(scope: Any, receive: Any, send: Any) -> None:
    """An ASGI app that is never called."""


@pytest.mark.parametrize(("cls", "args", "kwargs"), [
    (RateLimitMiddleware, (_app,), {"tiers": [Tier("t", "5/minute")],
                                   "settings": RateLimitSettings(storage_url="memory://")}),
    (MemoryStorage, (), {"max_keys": 10}),
    (HeaderFormat, ("draft-11",), {}),
], ids=["RateLimitMiddleware", "MemoryStorage", "HeaderFormat"])
def test_public_classes_can_be_subclassed(
    cls: type[Any], args: tuple[Any, ...], kwargs: dict[str, Any],
) -> None:
    """A class compiled with mypyc can still be subclassed in Python, and the subclass's
    overrides run."""
    class Sub(cls):  # type: ignore[misc, valid-type]
        def __repr__(self) -> str:
            return f"sub of {super().__repr__()}"

    made = Sub(*args, **kwargs)
    assert isinstance(made, cls)
    assert repr(made).startswith("sub of ")

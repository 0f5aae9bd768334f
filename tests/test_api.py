"""The public API: one flat namespace, sorted, every name importable."""

from __future__ import annotations

import importlib

import ratelimit_mw


def _isort_style(name: str) -> tuple[int, str]:
    """Constants, then classes, then functions (ruff's RUF022 order)."""
    return (0 if name.isupper() else 1 if name[0].isupper() else 2, name)


def test_all_is_sorted_and_unique() -> None:
    """__all__ is sorted (constants, classes, functions) and lists each name once."""
    names = ratelimit_mw.__all__
    assert names == sorted(set(names), key=_isort_style)


def test_every_exported_name_resolves() -> None:
    """Every name in __all__ loads (lazily) and is the object of its home module."""
    for name in ratelimit_mw.__all__:
        assert getattr(ratelimit_mw, name) is not None, name


def test_unknown_names_raise_attribute_error() -> None:
    """A typo is an AttributeError naming it, like any module."""
    try:
        ratelimit_mw.NoSuchThing  # type: ignore[attr-defined]  # noqa: B018
    except AttributeError as exc:
        assert "NoSuchThing" in str(exc)
    else:
        raise AssertionError("expected AttributeError")


def test_client_does_not_load_the_server_parts() -> None:
    """Importing the client alone loads no storage, middleware or redis module."""
    code = (
        "import sys, ratelimit_mw.client\n"
        "loaded = [m for m in sys.modules if m.startswith(('ratelimit_mw.storage', "
        "'ratelimit_mw.middleware', 'redis', 'starlette', 'limits'))]\n"
        "assert not loaded, loaded\n"
    )
    import subprocess
    import sys

    subprocess.run([sys.executable, "-c", code], check=True)


def test_modules_import_cleanly() -> None:
    """Each public module imports on its own."""
    for module in ("ratelimit_mw.client", "ratelimit_mw.breaker", "ratelimit_mw.idempotency",
                   "ratelimit_mw.storage", "ratelimit_mw.algorithms", "ratelimit_mw.openapi"):
        importlib.import_module(module)


def test_the_limit_decorator_is_not_shadowed_by_a_module() -> None:
    """``from ratelimit_mw import limit`` is the decorator, whatever was imported before."""
    import ratelimit_mw.policy  # noqa: F401 - a submodule import must not shadow the name
    from ratelimit_mw import limit
    from ratelimit_mw.routes import limit as decorator

    assert limit is decorator

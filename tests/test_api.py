"""The public API: one flat namespace of about twenty names, sorted, every name importable."""

from __future__ import annotations

import ast
import importlib
import importlib.metadata
import inspect

import pytest

import ratelimit_mw


def _isort_style(name: str) -> tuple[int, str]:
    """Constants, then classes, then functions (ruff's RUF022 order)."""
    return (0 if name.isupper() else 1 if name[0].isupper() else 2, name)


def test_all_is_sorted_and_unique() -> None:
    """__all__ is sorted (constants, classes, functions) and lists each name once."""
    names = ratelimit_mw.__all__
    assert names == sorted(set(names), key=_isort_style)


def test_every_exported_name_is_importable() -> None:
    """Every name in __all__ is importable and is the object its module defines."""
    for name in ratelimit_mw.__all__:
        value = getattr(ratelimit_mw, name)
        if name == "compiled":
            assert isinstance(value, bool)
            continue
        home = importlib.import_module(value.__module__)
        assert getattr(home, name) is value, name


def test_the_lazy_table_and_the_type_checking_imports_agree() -> None:
    """The names imported on first use (``_HOMES``) are __all__ (but ``compiled``), and
    each is imported from the same module under ``typing.TYPE_CHECKING``, where type checkers
    and IDEs read them."""
    tree = ast.parse(inspect.getsource(ratelimit_mw))
    guarded = next(node for node in tree.body if isinstance(node, ast.If)
                   and ast.unparse(node.test) == "typing.TYPE_CHECKING")
    imported = {alias.name: "." * node.level + (node.module or "")
                for node in guarded.body if isinstance(node, ast.ImportFrom)
                for alias in node.names}
    assert imported == ratelimit_mw._HOMES
    assert sorted([*ratelimit_mw._HOMES, "compiled"]) == sorted(ratelimit_mw.__all__)


def test_the_top_level_exports_nothing_else() -> None:
    """Only the names in __all__ (and the subpackages) are public at the top level, and
    dir() lists every one of them before any is used."""
    for name in ratelimit_mw.__all__:
        getattr(ratelimit_mw, name)
    public = {name for name, value in vars(ratelimit_mw).items()
              if not name.startswith("_") and not inspect.ismodule(value)}
    assert public == set(ratelimit_mw.__all__)
    assert set(ratelimit_mw.__all__) <= set(dir(ratelimit_mw))


def test_an_unknown_name_is_an_attribute_error() -> None:
    """A name the package does not have: AttributeError naming it (so ``hasattr`` and
    ``from ratelimit_mw import x`` behave as for any module)."""
    with pytest.raises(AttributeError, match="'no_such_name'"):
        ratelimit_mw.no_such_name  # noqa: B018
    assert not hasattr(ratelimit_mw, "Limiter")


def test_the_version_is_the_distributions() -> None:
    """``__version__`` is the one place the version is written: the installed
    distribution's metadata says the same."""
    assert ratelimit_mw.__version__ == importlib.metadata.version("ratelimit_mw")


def test_removed_spellings_are_gone() -> None:
    """Each thing has one spelling: the old alternatives are not importable."""
    from ratelimit_mw import limits, quota, rates

    assert not hasattr(ratelimit_mw.Limit, "parse")
    assert not hasattr(limits, "limits_from") and not hasattr(rates, "parse_rates")
    for old in ("ratelimit_mw.policy", "ratelimit_mw.plans", "ratelimit_mw.slots"):
        with pytest.raises(ModuleNotFoundError):
            importlib.import_module(old)
    assert not hasattr(quota, "quota_routes") and not hasattr(quota, "QuotaEndpoints")


def test_modules_import_cleanly() -> None:
    """Each public module imports on its own."""
    for module in ("ratelimit_mw.client", "ratelimit_mw.breaker", "ratelimit_mw.idempotency",
                   "ratelimit_mw.storage", "ratelimit_mw.algorithms", "ratelimit_mw.openapi"):
        importlib.import_module(module)


def test_the_limit_decorator_is_not_shadowed_by_a_module() -> None:
    """``from ratelimit_mw import limit`` is the decorator, whatever was imported before."""
    import ratelimit_mw.limits  # noqa: F401 - a submodule import must not shadow the name
    from ratelimit_mw import limit
    from ratelimit_mw.routes import limit as decorator

    assert limit is decorator

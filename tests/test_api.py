"""The public API: one flat namespace of about twenty names, sorted, every name importable."""

from __future__ import annotations

import ast
import importlib
import importlib.metadata
import inspect
import re
from pathlib import Path

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


def test_the_top_level_loads_every_name_but_one_on_first_use() -> None:
    """Every public name of the top level is in the lazy table, but ``compiled``, which
    is worked out on first use."""
    assert set(ratelimit_mw.__all__) - set(ratelimit_mw._HOMES) == {"compiled"}


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


SUBPACKAGES = ("algorithms", "breaker", "client", "idempotency", "metrics", "openapi",
               "overrides", "storage")
ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("name", SUBPACKAGES)
def test_each_subpackage_exports_a_sorted_importable_list(name: str) -> None:
    """Each subpackage's __all__ is sorted and unique, and every name in it is
    importable from the package and defined in one of its modules."""
    package = importlib.import_module(f"ratelimit_mw.{name}")
    names = package.__all__
    assert names == sorted(set(names), key=_isort_style)
    for exported in names:
        value = getattr(package, exported)
        if inspect.isclass(value) or inspect.isroutine(value):
            assert value.__module__.startswith(f"ratelimit_mw.{name}"), exported


@pytest.mark.parametrize("name", SUBPACKAGES)
def test_subpackages_have_no_private_modules(name: str) -> None:
    """One convention: modules are named for what they hold, public, behind a package
    whose __init__ hands on what its docs show."""
    folder = ROOT / "ratelimit_mw" / name
    private = [path.name for path in folder.glob("_*.py") if path.name != "__init__.py"]
    assert private == []


@pytest.mark.parametrize("name", ["", *SUBPACKAGES])
def test_a_lazy_table_and_its_type_checking_imports_agree(name: str) -> None:
    """A package that loads names on first use (``_HOMES``) imports exactly those names
    from the same modules under ``TYPE_CHECKING``, for type checkers and IDEs."""
    package = importlib.import_module(f"ratelimit_mw.{name}".rstrip("."))
    homes = getattr(package, "_HOMES", None)
    if homes is None:
        return
    tree = ast.parse(inspect.getsource(package))
    guarded = next(node for node in tree.body if isinstance(node, ast.If)
                   and ast.unparse(node.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING"))
    imported = {alias.name: "." * node.level + (node.module or "")
                for node in guarded.body if isinstance(node, ast.ImportFrom)
                for alias in node.names}
    assert imported == homes
    assert set(homes) <= set(package.__all__)


_DOC_IMPORT = re.compile(r"^\s*from (ratelimit_mw(?:\.\w+)*) import \(?([\w, \n]+?)\)?$",
                         re.MULTILINE)


def test_the_docs_import_only_exported_names() -> None:
    """Every ``from ratelimit_mw... import`` in the docs, the README and the example app
    names what that module's ``__all__`` exports."""
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md")),
             *sorted((ROOT / "example_app").glob("*.py"))]
    seen = 0
    for page in pages:
        for module_name, names in _DOC_IMPORT.findall(page.read_text()):
            module = importlib.import_module(module_name)
            for imported in (n.strip() for n in names.replace("\n", ",").split(",")):
                if imported:
                    seen += 1
                    assert imported in module.__all__, (page.name, module_name, imported)
    assert seen > 40


def test_each_class_name_is_defined_once() -> None:
    """No two classes (or type aliases) of the package share a name: one concept, one
    name, one place."""
    defined: dict[str, list[str]] = {}
    for path in sorted((ROOT / "ratelimit_mw").rglob("*.py")):
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.ClassDef):
                name = node.name
            elif (isinstance(node, ast.Assign | ast.AnnAssign)
                  and isinstance(target := (node.targets[0] if isinstance(node, ast.Assign)
                                            else node.target), ast.Name)
                  and target.id[:1].isupper() and not target.id.isupper()):
                name = target.id
            else:
                continue
            defined.setdefault(name, []).append(str(path.relative_to(ROOT)))
    assert {name: paths for name, paths in defined.items() if len(paths) > 1} == {}

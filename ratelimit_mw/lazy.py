"""Names a package hands on from its modules, each module imported on first use.

A package whose modules bring heavy dependencies (Starlette, redis-py, an optional
extra) lists them here instead of importing them, so that importing the package costs
nothing until a name is read. Type checkers read the same names from imports under
``typing.TYPE_CHECKING``; ``tests/test_api.py`` keeps the two equal.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["lazy_names"]


def lazy_names(
    package: str, homes: Mapping[str, str],
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``__getattr__`` and ``__dir__`` for ``package``, where ``homes`` maps each lazy
    name to the module that defines it (relative to the package: ``".middleware"``)."""
    namespace = importlib.import_module(package).__dict__

    def getattr_(name: str) -> Any:
        home = homes.get(name)
        if home is None:
            msg = f"module {package!r} has no attribute {name!r}"
            raise AttributeError(msg)
        try:
            module = importlib.import_module(home, package)
        except AttributeError as exc:  # from inside the module: not a missing name here
            msg = f"importing {name!r} from {package}{home} failed: {exc}"
            raise ImportError(msg) from exc
        value = getattr(module, name)
        namespace[name] = value  # read once: later reads find it without this function
        return value

    def dir_() -> list[str]:
        return sorted({*namespace, *namespace.get("__all__", ())})

    return getattr_, dir_

"""The HTTP libraries the client side serves: httpx2 (httpx's maintained successor, the
same API) and httpx, whichever are installed, side by side when both are.

A transport answers a client of either with the request's own library's classes. The
errors the client side raises derive from each installed library's class of that name,
so ``except httpx.HTTPError`` and ``except httpx2.HTTPError`` both catch them. Type
checking sees httpx.
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import TYPE_CHECKING, Any

__all__ = [
    "DEFAULT_LIBRARY",
    "HTTP_ERRORS",
    "LIBRARIES",
    "AsyncBaseTransport",
    "BaseTransport",
    "HTTPError",
    "TimeoutException",
    "TransportError",
    "classes",
    "library_of",
]

LIBRARY_NAMES = ("httpx2", "httpx")
"""In order of preference: the first installed is what `request` and `arequest` use."""


def _installed() -> tuple[ModuleType, ...]:
    found: list[ModuleType] = []
    for name in LIBRARY_NAMES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError:
            continue
        if module not in found:  # httpx2.alias_httpx() makes `httpx` httpx2 itself
            found.append(module)
    if not found:
        msg = ("ratelimit_mw.client needs httpx2 or httpx: "
               "pip install 'ratelimit_mw[client]' (or add httpx2 or httpx yourself)")
        raise ImportError(msg)
    return tuple(found)


LIBRARIES: tuple[ModuleType, ...] = _installed()
DEFAULT_LIBRARY: ModuleType = LIBRARIES[0]


def classes(name: str) -> tuple[type[Any], ...]:
    """Every installed library's class ``name``, for ``isinstance`` and ``except``."""
    return tuple(getattr(library, name) for library in LIBRARIES)


def _either(name: str) -> type[Any]:
    """One class deriving from every installed library's class ``name``: a base for ours."""
    bases = classes(name)
    if len(bases) == 1:
        return bases[0]
    return type(name, bases, {"__module__": __name__, "__doc__": bases[0].__doc__})


def library_of(thing: object) -> ModuleType:
    """The library of ``thing`` (a request, or a transport, perhaps of a subclass of
    one's); the default library when it is neither's."""
    by_name = {library.__name__: library for library in LIBRARIES}
    for cls in type(thing).__mro__:
        library = by_name.get(cls.__module__.partition(".")[0])
        if library is not None:
            return library
    return DEFAULT_LIBRARY


if TYPE_CHECKING:
    import httpx
    from httpx import AsyncBaseTransport, BaseTransport, HTTPError, TimeoutException, TransportError
else:
    AsyncBaseTransport = _either("AsyncBaseTransport")
    BaseTransport = _either("BaseTransport")
    HTTPError = _either("HTTPError")
    TimeoutException = _either("TimeoutException")
    TransportError = _either("TransportError")

HTTP_ERRORS: tuple[type[httpx.HTTPError], ...] = classes("HTTPError")

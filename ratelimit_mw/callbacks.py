"""Calling the application's own functions, which may be sync or async."""

from __future__ import annotations

import functools
import inspect

__all__ = ["is_async_callable"]


def is_async_callable(fn: object) -> bool:
    """True for ``async def`` functions and objects with an ``async def __call__``."""
    while isinstance(fn, functools.partial):
        fn = fn.func
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(
        getattr(fn, "__call__", None)  # noqa: B004 - we want the bound __call__, not callable()
    )

"""Calling a Redis Function through redis-py (Cluster, or a storage not pipelined).

``FCALL`` of a function the server lacks (after ``FUNCTION FLUSH``, a restart without
persistence, a new Cluster node) fails with "Function not found": its library is
loaded again (on every primary of a Cluster) and the call tried once more, as redis-py
does for a script on ``NOSCRIPT``. A server without Functions (before Redis 7.0) is
told apart by ``server_lacks_functions`` so the error can say what would be right.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from redis.exceptions import ResponseError

from .scripts import Library

__all__ = ["FunctionCall", "function_missing", "server_lacks_functions", "too_old"]

MINIMUM = "Redis 7.0 (or Valkey 7.2)"


def function_missing(exc: BaseException) -> bool:
    """True for the error of an ``FCALL`` whose function is not loaded."""
    return isinstance(exc, ResponseError) and "Function not found" in str(exc)


def server_lacks_functions(exc: BaseException) -> bool:
    """True for the error of a server that has no ``FCALL``/``FUNCTION`` commands."""
    text = str(exc).lower()
    return isinstance(exc, ResponseError) and "unknown command" in text and (
        "fcall" in text or "function" in text)


def too_old(exc: BaseException) -> ResponseError:
    """The error to raise instead of ``exc`` from a server without Functions."""
    return ResponseError(f"ratelimit_mw needs {MINIMUM} or later, whose Functions decide "
                         f"each request; this server answered: {exc}")


class FunctionCall:
    """``await call(keys=..., args=...)`` runs ``library.function`` on ``client``."""

    __slots__ = ("_client", "_loaded", "_loading", "library")

    def __init__(self, client: Any, library: Library) -> None:
        self._client = client
        self.library = library
        self._loading: asyncio.Lock | None = None
        self._loaded = 0  # loads done: a call that waited for one does not load again

    async def __call__(self, *, keys: Sequence[str], args: Sequence[str | int]) -> Any:
        function = self.library.function
        loaded = self._loaded
        try:
            return await self._client.fcall(function, len(keys), *keys, *args)
        except ResponseError as exc:
            if server_lacks_functions(exc):
                raise too_old(exc) from exc
            if not function_missing(exc):
                raise
        await self.load(loaded)
        return await self._client.fcall(function, len(keys), *keys, *args)

    async def load(self, seen: int | None = None) -> None:
        """Load the library (``FUNCTION LOAD REPLACE``; on a Cluster, every primary),
        unless a load has finished since ``seen`` (calls that failed together load once)."""
        if self._loading is None:
            self._loading = asyncio.Lock()
        async with self._loading:
            if seen is not None and self._loaded != seen:
                return
            try:
                await self._client.function_load(self.library.source, replace=True)
            except ResponseError as exc:
                if server_lacks_functions(exc):
                    raise too_old(exc) from exc
                raise
            self._loaded += 1

"""Lease ids of concurrency slots, unique across processes."""

from __future__ import annotations

import itertools
import os
import secrets
from typing import Final

__all__ = ["new_lease_id"]


class _LeaseIds:
    """Lease ids unique across processes: a random prefix per process, then a count
    (cheaper than a random token per request)."""

    __slots__ = ("_count", "_prefix")

    def __init__(self) -> None:
        self.renew()

    def renew(self) -> None:
        self._prefix = secrets.token_hex(8)
        self._count = itertools.count()  # next() is atomic: threads' draws never repeat

    def draw(self) -> str:
        return self._prefix + str(next(self._count))


_ids: Final = _LeaseIds()
# A worker forked after this import (gunicorn --preload) must not repeat its parent's ids.
os.register_at_fork(after_in_child=_ids.renew)


def new_lease_id() -> str:
    """A lease id no other lease of any process has: the process's random prefix (16 hex
    digits), then its count."""
    return _ids.draw()

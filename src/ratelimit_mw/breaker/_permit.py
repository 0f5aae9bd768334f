"""The leave to make one call through a breaker, and the report of how it went."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ._breaker import CircuitBreaker

__all__ = ["Permit"]


class Permit:
    """Leave for one call through a breaker; report how the call went exactly once.

    The first report counts and later ones are ignored, so ``release()`` in a
    ``finally`` is always safe. A report is also ignored when the breaker has
    changed state since the permit was given (the call belongs to a past epoch).
    ``started`` is the breaker's clock reading when the permit was given.
    """

    __slots__ = ("_breaker", "_done", "_epoch", "started")

    def __init__(self, breaker: CircuitBreaker, epoch: int, started: float) -> None:
        self._breaker = breaker
        self._epoch = epoch
        self._done = False
        self.started = started

    def record_success(self) -> None:
        """The call worked (it may still count as slow)."""
        self._finish(failed=False)

    def record_failure(self) -> None:
        """The call failed."""
        self._finish(failed=True)

    def record_exception(self, exc: BaseException) -> None:
        """The call raised ``exc``: a failure if the breaker's rules say so, else a success.

        A ``BaseException`` that is not an ``Exception`` (``asyncio.CancelledError``,
        ``KeyboardInterrupt``) says nothing about the dependency: the slot is released.
        """
        if not isinstance(exc, Exception):
            self.release()
            return
        self._finish_by(self._breaker._is_failure_exception, exc)

    def record_result(self, result: object) -> None:
        """The call returned ``result``: a failure if ``is_failure_result`` says so."""
        self._finish_by(self._breaker._is_failure_result, result)

    def release(self) -> None:
        """Give the slot back without counting the call (it was cancelled or abandoned)."""
        if not self._done:
            self._done = True
            self._breaker._release(self, self._epoch)

    def _finish_by(self, predicate: Callable[[Any], bool], value: object) -> None:
        """Finish as ``predicate(value)`` says; a predicate that raises releases the slot."""
        if self._done:
            return
        try:
            failed = predicate(value)
        except BaseException:
            self.release()
            raise
        self._finish(failed=bool(failed))

    def _finish(self, *, failed: bool) -> None:
        if not self._done:
            self._done = True
            self._breaker._record(self, self._epoch, failed)

    def __repr__(self) -> str:
        status = "done" if self._done else "open"
        return f"<Permit of {self._breaker.name!r} epoch={self._epoch} {status}>"

"""A retry budget shared by many calls, as in gRPC: a fleet stops retrying when most calls fail."""

from __future__ import annotations

import math
import threading

__all__ = ["RetryBudget"]


class RetryBudget:
    """Tokens that failures spend and successes earn back; retries stop at half.

    Starts full with ``max_tokens``. Every failed attempt costs 1 token, every
    success earns ``token_ratio``. Retries are allowed only while more than
    half the tokens are left. Share one budget among the transports (and
    threads, and tasks) that call the same service.

    >>> budget = RetryBudget(max_tokens=4, token_ratio=0.5)
    >>> budget.record_failure(); budget.record_failure()
    >>> budget.can_retry()
    False
    >>> budget.record_success()
    >>> budget.can_retry()
    True
    """

    __slots__ = ("_lock", "_tokens", "max_tokens", "token_ratio")

    def __init__(self, max_tokens: float = 10.0, token_ratio: float = 0.1) -> None:
        if not (0 < max_tokens < math.inf):
            msg = f"max_tokens must be a finite number > 0, got {max_tokens!r}"
            raise ValueError(msg)
        if not (0 < token_ratio <= max_tokens):
            msg = f"token_ratio must be > 0 and <= max_tokens, got {token_ratio!r}"
            raise ValueError(msg)
        self.max_tokens = float(max_tokens)
        self.token_ratio = float(token_ratio)
        self._tokens = self.max_tokens
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return (
            f"RetryBudget(tokens={self._tokens:g}/{self.max_tokens:g}, "
            f"token_ratio={self.token_ratio:g})"
        )

    @property
    def tokens(self) -> float:
        """Tokens left now."""
        return self._tokens

    def record_failure(self) -> None:
        """Spend one token for a failed attempt (a retryable status or a connection error)."""
        with self._lock:
            self._tokens = max(0.0, self._tokens - 1.0)

    def record_success(self) -> None:
        """Earn ``token_ratio`` tokens for an attempt that got a final answer."""
        with self._lock:
            self._tokens = min(self.max_tokens, self._tokens + self.token_ratio)

    def can_retry(self) -> bool:
        """Return whether a retry may be scheduled: more than half the tokens are left."""
        return self._tokens > self.max_tokens / 2

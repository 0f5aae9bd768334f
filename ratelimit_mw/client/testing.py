"""A switch that makes every wait instant, for the test suites of our users."""

from __future__ import annotations

__all__ = ["is_testing", "set_testing"]

_testing = False


def set_testing(enabled: bool) -> None:
    """Make every retry wait and token-bucket wait instant (True) or real again (False).

    Retries still happen and still count against ``max_retries``; only the
    sleeping is skipped, so a test suite that talks to a flaky fake server
    stays fast. Every decision stays the one made without it: a skipped wait counts
    against ``max_time`` as if it had been waited.
    """
    global _testing
    _testing = enabled


def is_testing() -> bool:
    """Return whether :func:`set_testing` switched waits off."""
    return _testing

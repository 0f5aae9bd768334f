"""GuardedStorage's own arguments: a bad one fails at start-up, naming it (compiled too)."""

from __future__ import annotations

import re

import pytest

from ratelimit_mw import ConfigError, MemoryStorage
from ratelimit_mw.failure import GuardedStorage


@pytest.mark.parametrize(("options", "match"), [
    ({"timeout": True}, "storage timeout must be a positive number of seconds, got True"),
    ({"timeout": "0.05"}, "storage timeout must be a positive number of seconds, got '0.05'"),
    ({"timeout": 0}, "storage timeout must be a positive number of seconds, got 0"),
    ({"recovery_interval": float("inf")}, "recovery interval must be a positive number"),
    ({"mode": None}, "unknown failure mode None"),
    ({"mode": "maybe"}, "unknown failure mode 'maybe'"),
])
def test_bad_arguments_are_config_errors(options: dict[str, object], match: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(match)):
        GuardedStorage(MemoryStorage(), **options)  # type: ignore[arg-type]


def test_good_arguments_are_kept() -> None:
    guard = GuardedStorage(MemoryStorage(), mode="Memory", timeout=1, recovery_interval=0.5)
    assert (guard.mode, guard.timeout) == ("memory", 1.0) and guard.fallback is not None

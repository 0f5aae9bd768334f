"""GuardedStorage's own arguments: a bad one fails at start-up, naming it (compiled too)."""

from __future__ import annotations

import re
from collections.abc import Sequence

import pytest

from ratelimit_mw import ConfigError, Hit, Limit, MemoryStorage
from ratelimit_mw.decision import Verdict
from ratelimit_mw.errors import StorageError
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


class _Down(MemoryStorage):
    """A storage whose every decision fails, as a Redis that is gone."""

    async def decide_within(self, timeout: float | None, key: str, hits: Sequence[Hit], *,
                            usage: int = 0) -> Verdict:
        raise StorageError("redis is gone")


async def test_closed_mode_asks_to_wait_for_the_next_trial_from_the_first_refusal() -> None:
    """Retry-After is the breaker's next trial call: a whole recovery interval at the first
    refusal (the breaker not yet open), the rest of its cooldown once it is open."""
    guard = GuardedStorage(_Down(), mode="closed", timeout=0.05, recovery_interval=5)
    hit = [Hit(Limit("1/minute"))]
    waits = []
    for _ in range(5):
        verdict, source = await guard.decide("k", hit)
        assert (verdict, source) == (None, "unavailable")
        waits.append(guard.retry_after)
    assert guard.breaker.remaining_cooldown > 0  # opened after the first failures
    assert waits == [5] * 5


async def test_the_storage_breaker_logs_each_transition_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Storage down, then back: one line when the storage breaker opens, one when it
    goes half-open, one when it closes; nothing in between."""
    import asyncio
    import logging

    class Flaky(_Down):
        down = True

        async def decide_within(self, timeout: float | None, key: str, hits: Sequence[Hit],
                                *, usage: int = 0) -> Verdict:
            if self.down:
                raise StorageError("redis is gone")
            return await MemoryStorage.decide_within(self, timeout, key, hits, usage=usage)

    storage = Flaky()
    guard = GuardedStorage(storage, mode="closed", timeout=0.05, recovery_interval=0.05)
    hit = [Hit(Limit("100/minute"))]
    with caplog.at_level(logging.INFO, logger="ratelimit_mw.breaker"):
        for _ in range(6):
            await guard.decide("k", hit)
        storage.down = False
        await asyncio.sleep(0.06)
        for _ in range(3):
            assert (await guard.decide("k", hit))[1] == "storage"
    lines = [r.getMessage() for r in caplog.records if r.name == "ratelimit_mw.breaker"]
    assert [line.split(": ", 1)[1].split(" (")[0] for line in lines] == [
        "closed -> open", "open -> half_open", "half_open -> closed"], lines
    assert all(line.startswith("circuit 'ratelimit-storage'") for line in lines)

"""The outage log: two lines an outage, however many failures it counts."""

from __future__ import annotations

import asyncio
import logging

import pytest

from ratelimit_mw.errors import StorageError
from ratelimit_mw.outages import OutageLog


def _lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [record.getMessage() for record in caplog.records]


def test_an_outage_logs_its_first_failure_and_its_end_with_counts(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A thousand failures make one line; the success after them makes the second."""
    log = OutageLog("slot release", "slot_release_failed", "slots free themselves")
    with caplog.at_level(logging.WARNING, logger="ratelimit_mw"):
        for _ in range(1000):
            log.failed(StorageError("connection refused"), 2)
        assert log.failing
        log.succeeded()
        log.succeeded()  # nothing to end
    lines = _lines(caplog)
    assert len(lines) == 2
    assert lines[0].startswith("ratelimit_mw slot release failed: event=slot_release_failed "
                               "error=StorageError: connection refused; slots free themselves")
    assert "event=slot_release_failed_recovered failures=1000 items=2000" in lines[1]
    assert not log.failing


async def test_an_outage_without_a_success_ends_after_a_quiet_spell(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A path that can't see its successes ends its outage ``quiet`` seconds after the
    last failure, and a failure after that begins a new one."""
    log = OutageLog("settlement", "settlement_failed", "estimates stay", quiet=0.05)
    with caplog.at_level(logging.WARNING, logger="ratelimit_mw"):
        log.failed("boom")
        await asyncio.sleep(0.03)
        log.failed("boom")  # the quiet spell starts again
        await asyncio.sleep(0.03)
        assert log.failing
        await asyncio.sleep(0.06)
        assert not log.failing
        log.failed("again")
    lines = _lines(caplog)
    assert len(lines) == 3
    assert "failures=2 seconds=" in lines[1]
    assert "error=again" in lines[2]


def test_outside_an_event_loop_the_next_failure_ends_a_quiet_outage(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """With no loop to time the quiet spell, a failure long after the last one ends the
    old outage before beginning the next."""
    log = OutageLog("quota read", "quota_unavailable", "503", recovered="quota_recovered",
                    quiet=0.0)
    with caplog.at_level(logging.WARNING, logger="ratelimit_mw"):
        log.failed("one")
        log.failed("two")
    assert [line.split(":", 1)[0] for line in _lines(caplog)] == [
        "ratelimit_mw quota read failed", "ratelimit_mw quota read recovered",
        "ratelimit_mw quota read failed"]
    assert "event=quota_recovered" in _lines(caplog)[1]

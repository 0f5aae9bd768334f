"""The queue in front of the Cluster and Sentinel clients: waits its turn, or times out."""

from __future__ import annotations

import asyncio

import pytest
from redis.exceptions import ConnectionError as RedisConnectionError

from ratelimit_mw.storage.pool import ConnectionQueue


async def test_callers_beyond_the_size_wait_their_turn() -> None:
    """With room for two, the third caller starts only when one of the two is done."""
    queue = ConnectionQueue(2, timeout=5)
    running: list[int] = []
    peak = 0

    async def command() -> None:
        nonlocal peak
        async with queue.turn():
            running.append(1)
            peak = max(peak, len(running))
            await asyncio.sleep(0.01)
            running.pop()

    await asyncio.gather(*(command() for _ in range(10)))
    assert peak == 2


async def test_a_caller_that_waits_too_long_gets_a_connection_error() -> None:
    """No turn within the timeout: redis's ConnectionError, which the storage reports."""
    queue = ConnectionQueue(1, timeout=0.05)
    async with queue.turn():
        with pytest.raises(RedisConnectionError, match=r"no free connection within 0\.05 s"):
            async with queue.turn():
                pass
    async with queue.turn():  # the turn given back, and none lost to the timeout
        pass

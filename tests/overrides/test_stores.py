"""The override stores on every storage: a change by one view reaches another within a
second (pub/sub on Redis and Sentinel, the version poll on Cluster)."""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid

import pytest

from ratelimit_mw.errors import StorageError
from ratelimit_mw.overrides import Override, Overrides, caller_key
from ratelimit_mw.overrides.store import MemoryOverrideStore, OverrideStore, RedisOverrideStore


@pytest.fixture(params=["redis", "cluster", "sentinel"])
def url(request: pytest.FixtureRequest) -> str:
    name = "redis_url" if request.param == "redis" else f"redis_{request.param}_url"
    return str(request.getfixturevalue(name))


async def _within(check: object, timeout: float) -> float:
    start = time.monotonic()
    while not check():  # type: ignore[operator]
        if time.monotonic() - start > timeout:
            pytest.fail(f"not seen within {timeout} s")
        await asyncio.sleep(0.01)
    return time.monotonic() - start


async def test_a_change_reaches_another_view_within_a_second(url: str) -> None:
    """Set and delete through one view; the other applies both in under a second."""
    prefix = f"rltest:{uuid.uuid4().hex[:12]}:"
    writer = Overrides.from_url(url, prefix=prefix)
    reader = Overrides.from_url(url, prefix=prefix)
    key = caller_key("api_key:acme")
    try:
        await reader.start()
        await writer.set(Override(key, limits="9/minute", plan="acme"), by="test")
        assert await _within(lambda: reader.find(key) is not None, timeout=3) < 1.0
        await writer.delete(key, by="test")
        assert await _within(lambda: reader.find(key) is None, timeout=3) < 1.0
    finally:
        store = writer.store
        assert isinstance(store, RedisOverrideStore)
        await store.client.delete(store.hash, store.version_key)
        await reader.close()
        await writer.close()


async def test_the_view_keeps_its_overrides_while_the_store_fails() -> None:
    """A store that can't be read leaves the known overrides in force."""
    store = MemoryOverrideStore()
    view = Overrides(store)
    key = caller_key("ip:203.0.113.9")
    await view.set(Override(key, blocked_until=time.time() + 60))

    async def broken() -> tuple[int, list[Override]]:
        raise StorageError("down")

    store.load = broken  # type: ignore[method-assign]
    with pytest.raises(StorageError, match="down"):
        await view.refresh()
    assert view.find(key) is not None


class _DeafSubscriber:
    """A pub/sub whose read swallows a cancellation, as redis-py's can when the cancel
    lands as its read times out."""

    def __init__(self, closed: list[bool]) -> None:
        self.closed = closed

    async def subscribe(self, channel: str) -> None:
        pass

    async def get_message(self, *, ignore_subscribe_messages: bool, timeout: float) -> None:
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.sleep(timeout)

    async def aclose(self) -> None:
        self.closed.append(True)


class _DeafStore(OverrideStore):
    channel = "changes"

    def __init__(self) -> None:
        self.closed: list[bool] = []

    async def load(self) -> tuple[int, list[Override]]:
        return 1, []

    async def version(self) -> int:
        return 1

    async def set(self, override: Override) -> Override | None:
        return None

    async def delete(self, caller: str) -> Override | None:
        return None

    def subscriber(self) -> _DeafSubscriber:
        return _DeafSubscriber(self.closed)


async def test_a_follower_that_misses_its_cancel_still_stops() -> None:
    """close() ends the follower even when its read swallows the cancellation: it stops
    by the end of that read and closes its subscriber, instead of following for good."""
    store = _DeafStore()
    view = Overrides(store, refresh_interval=0.2)
    await view.start()
    task = view._task
    assert task is not None
    await asyncio.sleep(0.05)  # the follower is in its read
    start = time.monotonic()
    await view.close()
    assert task.done() and not task.cancelled()  # it ended by itself, cancel swallowed
    assert time.monotonic() - start < 2.0  # by its read's end, not close()'s 5.2 s wait
    assert store.closed == [True]

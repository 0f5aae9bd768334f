"""The override stores on every storage: a change by one view reaches another within a
second (pub/sub on Redis and Sentinel, the version poll on Cluster)."""

from __future__ import annotations

import asyncio
import time
import uuid

import pytest

from ratelimit_mw.errors import StorageError
from ratelimit_mw.overrides import Override, Overrides, caller_key
from ratelimit_mw.overrides.store import MemoryOverrideStore, RedisOverrideStore


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

"""Shared fixtures: a real Redis (started here when none answers) and the storage matrix."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import pytest
import redis as sync_redis

from ratelimit_mw import (
    MemoryStorage,
    RateLimitSettings,
    RedisStorage,
    Storage,
)

pytest_plugins = ["tests.redis_servers"]

DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"


# The middleware's own keyword arguments (compiled, its class has no signature to read).
_MIDDLEWARE_ARGUMENTS = frozenset({
    "settings", "storage", "tiers", "key", "tier_resolver", "rules", "on_denied",
    "on_decision", "clock", "breaker"})


def middleware_arguments(**options: Any) -> dict[str, Any]:
    """The middleware's keyword arguments from a test's options: its own pass through,
    the rest become ``settings=RateLimitSettings(...)`` (over a given ``settings``)."""
    own = {name: value for name, value in options.items() if name in _MIDDLEWARE_ARGUMENTS}
    fields = {name: value for name, value in options.items() if name not in own}
    if fields:
        given = own.get("settings")
        base = given.model_dump(exclude_unset=True) if given is not None else {}
        own["settings"] = RateLimitSettings.model_validate({**base, **fields})
    return own


def _answers(url: str) -> bool:
    try:
        client = sync_redis.Redis.from_url(url, socket_connect_timeout=0.5, socket_timeout=0.5)
        try:
            return bool(client.ping())
        finally:
            client.close()
    except (sync_redis.RedisError, OSError):
        return False


def free_port() -> int:
    """A TCP port on loopback that nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    """A Redis URL that answers: $REDIS_URL, the default port, or a throwaway server."""
    url = os.environ.get("REDIS_URL", DEFAULT_REDIS_URL)
    if _answers(url):
        yield url
        return
    server = shutil.which("redis-server")
    if server is None:
        if os.environ.get("CI"):
            pytest.fail(f"no Redis answers at {url} and redis-server is not installed")
        pytest.skip(f"no Redis answers at {url} and redis-server is not installed")
    port = free_port()
    workdir = tempfile.mkdtemp(prefix="ratelimit-redis-")
    proc = subprocess.Popen(
        [server, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
         "--dir", workdir],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    url = f"redis://127.0.0.1:{port}/0"
    deadline = time.monotonic() + 10
    while not _answers(url):
        if time.monotonic() > deadline or proc.poll() is not None:
            proc.kill()
            pytest.fail(f"the throwaway redis-server on port {port} did not start")
        time.sleep(0.05)
    try:
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        shutil.rmtree(workdir, ignore_errors=True)


@pytest.fixture
def redis_prefix(redis_url: str) -> Iterator[str]:
    """A key prefix of this test's own; its keys are deleted afterwards."""
    prefix = f"rltest:{uuid.uuid4().hex[:12]}:"
    yield prefix
    client = sync_redis.Redis.from_url(redis_url)
    try:
        names = list(client.scan_iter(match=prefix + "*", count=1000))
        if names:
            client.delete(*names)
    finally:
        client.close()


class FakeClock:
    """A wall clock that only moves when told to."""

    __slots__ = ("now",)

    def __init__(self, now: float = 1_700_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds

    def __repr__(self) -> str:
        return f"FakeClock(now={self.now!r})"


def on_clock(storage: RedisStorage, clock: Callable[[], float] | None) -> RedisStorage:
    """``storage`` deciding on ``clock`` instead of Redis's own (None: Redis's), so that
    memory and Redis can run on one simulated time."""
    storage._clock = clock
    return storage


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


StorageFactory = Callable[..., Storage]


@pytest.fixture(params=["memory", "redis", "cluster", "sentinel"])
async def make_storage(
    request: pytest.FixtureRequest,
) -> AsyncIterator[StorageFactory]:
    """Build storages of one backend of the matrix: ``make_storage(clock=None, **options)``.

    ``cluster`` and ``sentinel`` run on throwaway deployments started for the session.
    """
    if request.param in ("cluster", "sentinel"):
        from tests.redis_servers import storage_factory  # here: see the plugin's docstring

        async with storage_factory(request.getfixturevalue(f"redis_{request.param}_url")) as made:
            yield made
        return
    made: list[Storage] = []
    if request.param == "memory":
        def factory(clock: Callable[[], float] | None = None, **options: object) -> Storage:
            storage = MemoryStorage(clock=clock or time.time, **options)  # type: ignore[arg-type]
            made.append(storage)
            return storage
    else:
        url = request.getfixturevalue("redis_url")
        prefix = request.getfixturevalue("redis_prefix")

        def factory(clock: Callable[[], float] | None = None, **options: object) -> Storage:
            storage = on_clock(RedisStorage.from_url(url, prefix=prefix, **options), clock)  # type: ignore[arg-type]
            made.append(storage)
            return storage
    yield factory
    for storage in made:
        await storage.close()


@pytest.fixture
async def storage(make_storage: StorageFactory, clock: FakeClock) -> Storage:
    """One storage of the matrix, on the fake clock."""
    return make_storage(clock=clock)

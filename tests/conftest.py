"""Shared fixtures: a real Redis (our own, unless $REDIS_URL names a shared one) and the
storage matrix."""

from __future__ import annotations

import os
import socket
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import pytest
import redis as sync_redis
from redis.connection import parse_url

from ratelimit_mw import (
    MemoryStorage,
    RateLimitSettings,
    RedisStorage,
    Storage,
)

pytest_plugins = ["tests.redis_servers"]

SHARED_REDIS_VARIABLE = "REDIS_URL"
QUICK_LOOP_LEAVES_OUT = ("slow", "reliability")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--every-test", action="store_true",
                     help="run the slow and reliability tests even without paths or -m")


def _quick_loop(config: pytest.Config) -> bool:
    """A bare ``pytest`` (no paths, no -m): the quick loop a developer runs between edits."""
    return (config.args_source is pytest.Config.ArgsSource.TESTPATHS
            and not config.option.markexpr and not config.option.every_test)


def pytest_report_header(config: pytest.Config) -> str | None:
    if not _quick_loop(config):
        return None
    return ("quick loop: slow and reliability tests left out "
            "(--every-test, a path or -m runs them; ./scripts/test runs everything)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Leave the slow and reliability tests out of the quick loop."""
    if not _quick_loop(config):
        return
    kept: list[pytest.Item] = []
    left_out: list[pytest.Item] = []
    for item in items:
        slow = any(item.get_closest_marker(name) for name in QUICK_LOOP_LEAVES_OUT)
        (left_out if slow else kept).append(item)
    if left_out:
        config.hook.pytest_deselected(items=left_out)
        items[:] = kept


# The middleware's own keyword arguments (compiled, its class has no signature to read).
_MIDDLEWARE_ARGUMENTS = frozenset({
    "settings", "storage", "tiers", "key", "tier_resolver", "rules", "on_denied",
    "on_decision", "clock", "breaker", "metrics", "overrides"})


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


def shared_redis_problem(url: str) -> str | None:
    """Why the suite must not count on the shared Redis at ``url``, or None when it may.

    A server the suite did not start may hold someone's data: database 0, where it
    usually lives, is refused, so a shared server is used only on a database named for it.
    """
    try:
        options = parse_url(url)
    except ValueError as exc:
        return f"${SHARED_REDIS_VARIABLE}={url!r} is not a Redis URL: {exc}"
    if int(options.get("db") or 0) == 0:
        return (f"${SHARED_REDIS_VARIABLE}={url!r} names database 0 of a shared server, "
                "which may hold someone's data; name a database of the tests' own "
                "(e.g. redis://127.0.0.1:6379/15), or leave the variable unset so the "
                "tests start their own redis-server")
    return None


@pytest.fixture(scope="session")
def redis_url(request: pytest.FixtureRequest) -> str:
    """The Redis most tests count on: a redis-server this session starts on a free port,
    or a shared server when $REDIS_URL names one (and a database other than 0).

    Tests run nothing there but their own keys, under ``redis_prefix``; anything that
    affects the whole server (SCRIPT FLUSH, FLUSHDB, restarts) runs on ``own_redis_url``.
    """
    shared = os.environ.get(SHARED_REDIS_VARIABLE)
    if not shared:
        return str(request.getfixturevalue("own_redis_url"))
    problem = shared_redis_problem(shared)
    if problem is not None:
        pytest.fail(problem)
    if not _answers(shared):
        pytest.fail(f"no Redis answers at ${SHARED_REDIS_VARIABLE}={shared!r}")
    return shared


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


# Cluster and Sentinel deployments take seconds to start: not in the quick loop.
@pytest.fixture(params=["memory", "redis", pytest.param("cluster", marks=pytest.mark.slow),
                        pytest.param("sentinel", marks=pytest.mark.slow)])
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

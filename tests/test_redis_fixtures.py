"""The suite's Redis is its own: a shared server is used only when named, never on db 0."""

from __future__ import annotations

import os

import pytest
import redis as sync_redis

from tests.conftest import SHARED_REDIS_VARIABLE, shared_redis_problem
from tests.redis_servers import RedisProcess

pytestmark = pytest.mark.redis


def _server_pid(url: str) -> int:
    client = sync_redis.Redis.from_url(url, socket_timeout=2)
    try:
        return int(client.info("server")["process_id"])
    finally:
        client.close()


def test_the_own_server_is_a_process_this_session_started(
    own_redis_server: RedisProcess, own_redis_url: str,
) -> None:
    """The server answering at ``own_redis_url`` is the redis-server this session spawned."""
    assert own_redis_server.pid is not None
    assert _server_pid(own_redis_url) == own_redis_server.pid


def test_redis_url_is_our_own_server_unless_a_shared_one_is_named(
    redis_url: str, own_redis_server: RedisProcess,
) -> None:
    """Without $REDIS_URL the tests count on the session's own server; with it, on the
    named server and database, which is never database 0."""
    shared = os.environ.get(SHARED_REDIS_VARIABLE)
    if shared:
        assert redis_url == shared
        assert shared_redis_problem(redis_url) is None
    else:
        assert _server_pid(redis_url) == own_redis_server.pid


@pytest.mark.parametrize("url", [
    "redis://127.0.0.1:6379",
    "redis://127.0.0.1:6379/0",
    "redis://127.0.0.1:6379/?db=0",
    "redis://:secret@cache:6379/",
    "rediss://cache:6380/0",
    "unix:///run/redis.sock",
])
def test_database_0_of_a_shared_server_is_refused(url: str) -> None:
    """A shared server's database 0 may hold someone's data: the suite refuses it, and
    says which database to name instead."""
    problem = shared_redis_problem(url)
    assert problem is not None
    assert "database 0" in problem and "redis://127.0.0.1:6379/15" in problem


@pytest.mark.parametrize("url", [
    "redis://127.0.0.1:6379/15",
    "redis://127.0.0.1:6379?db=9",
    "rediss://cache:6380/2",
    "unix:///run/redis.sock?db=3",
])
def test_a_named_database_of_a_shared_server_is_accepted(url: str) -> None:
    """A shared server on a database other than 0 is what $REDIS_URL is for."""
    assert shared_redis_problem(url) is None


def test_a_shared_url_that_is_not_redis_is_refused() -> None:
    """A $REDIS_URL that isn't a Redis URL is named in the message."""
    problem = shared_redis_problem("http://127.0.0.1:6379/15")
    assert problem is not None and "'http://127.0.0.1:6379/15'" in problem

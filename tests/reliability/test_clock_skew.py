"""Two app servers whose clocks differ by 30 s share one Redis limit exactly: decisions
run on Redis's clock, not theirs."""

from __future__ import annotations

import contextlib
import re
import uuid
from collections.abc import Iterator

import httpx
import pytest

from ratelimit_mw.limits import ALGORITHM_NAMES
from tests.reliability.servers import assert_keys_expire, delete_prefix, uvicorn_server

pytestmark = [pytest.mark.reliability, pytest.mark.redis, pytest.mark.slow]

LIMIT = 20
SKEW = 30.0


@pytest.fixture(scope="module")
def servers(redis_url: str) -> Iterator[tuple[str, str, str]]:
    """Two uvicorn servers on the same Redis and prefix, the second 30 s ahead."""
    prefix = f"rlrel:{uuid.uuid4().hex[:12]}:"
    env = {
        "RATELIMIT_STORAGE_URL": redis_url,
        "RATELIMIT_STORAGE_PREFIX": prefix,
        "RATELIMIT_FAILURE_MODE": "closed",
        "RATELIMIT_STORAGE_TIMEOUT": "2",
        "RATELIMIT_HEADER_STYLE": "legacy+draft-11",
        "RATELIMIT_DEFAULT_LIMITS": "1000000/day",
        "RL_APP_LIMIT": str(LIMIT),
        "RL_APP_PERIOD": "hour",
    }
    try:
        with contextlib.ExitStack() as stack:
            honest = stack.enter_context(uvicorn_server(env))
            ahead = stack.enter_context(uvicorn_server({**env, "RL_APP_CLOCK_SKEW": str(SKEW)}))
            yield honest, ahead, prefix
    finally:
        delete_prefix(redis_url, prefix)


def _reset_in(response: httpx.Response, policy: str) -> int:
    """Seconds until ``policy`` restores, from the draft-11 ``RateLimit`` header."""
    found = re.search(rf'"{policy}";r=\d+;t=(\d+)', response.headers["ratelimit"])
    assert found, response.headers["ratelimit"]
    return int(found.group(1))


def test_the_second_server_is_30_s_ahead(servers: tuple[str, str, str]) -> None:
    """The premise: the servers' clocks really differ by 30 s."""
    honest, ahead, _ = servers
    times = [httpx.get(f"{url}/time").json()["time"] for url in (honest, ahead)]
    assert SKEW - 1 < times[1] - times[0] < SKEW + 1


@pytest.mark.parametrize("algorithm", ALGORITHM_NAMES)
def test_skewed_servers_share_one_limit_exactly(
    servers: tuple[str, str, str], redis_url: str, algorithm: str,
) -> None:
    """Limit 20: 10 requests on each server pass, the 21st is a 429 on either, and both
    denials report the same wait and time until the limit restores (within a second)."""
    honest, ahead, prefix = servers
    path = f"/alg/{algorithm}"
    with httpx.Client(base_url=honest) as a, httpx.Client(base_url=ahead) as b:
        passed = [client.get(path) for _ in range(LIMIT // 2) for client in (a, b)]
        assert [r.status_code for r in passed] == [200] * LIMIT
        assert [r.headers["x-rl-source"] for r in passed] == ["storage"] * LIMIT
        assert passed[-1].headers["x-ratelimit-remaining"] == "0"
        denied = [a.get(path), b.get(path)]
    assert [r.status_code for r in denied] == [429, 429]
    waits = [int(r.headers["retry-after"]) for r in denied]
    assert abs(waits[0] - waits[1]) <= 1
    assert abs(_reset_in(denied[0], algorithm) - _reset_in(denied[1], algorithm)) <= 1
    assert assert_keys_expire(redis_url, prefix) >= 1


def test_skewed_servers_agree_on_the_epoch_reset(servers: tuple[str, str, str]) -> None:
    """The legacy epoch X-RateLimit-Reset of one counter agrees across the two servers:
    it is built on the Redis server's clock, not on each app server's."""
    honest, ahead, _ = servers
    resets = [int(httpx.get(f"{url}/alg/fixed_window").headers["x-ratelimit-reset"])
              for url in (honest, ahead)]
    assert abs(resets[0] - resets[1]) <= 1, resets

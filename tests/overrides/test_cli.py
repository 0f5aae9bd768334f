"""``python -m ratelimit_mw overrides`` against a real Redis, as an operator runs it."""

from __future__ import annotations

import json
import subprocess
import sys

from ratelimit_mw import RedisStorage
from ratelimit_mw.hits import Hit
from ratelimit_mw.limits import Limit
from ratelimit_mw.overrides import Overrides, caller_key


def _cli(url: str, prefix: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ratelimit_mw", "overrides", "--url", url,
                           "--prefix", prefix, *args], capture_output=True, text=True,
                          timeout=60, check=False)


async def test_set_list_get_delete_reset(redis_url: str, redis_prefix: str) -> None:
    """What the command line sets, a worker's view loads; it lists, reads, deletes and
    resets counters."""
    body = json.dumps({"caller": "api_key:acme", "limits": "9/minute", "plan": "acme"})
    done = _cli(redis_url, redis_prefix, "set", body)
    assert done.returncode == 0, done.stderr
    key = caller_key("api_key:acme")
    view = Overrides.from_url(redis_url, prefix=redis_prefix)
    try:
        await view.refresh()
        applied = view.find(key)
        assert applied is not None and applied.override.plan == "acme"
    finally:
        await view.close()
    listed = _cli(redis_url, redis_prefix, "list").stdout.splitlines()
    assert [json.loads(line)["caller"] for line in listed] == [key]
    assert json.loads(_cli(redis_url, redis_prefix, "get", "api_key:acme").stdout)["plan"] == "acme"
    storage = RedisStorage.from_url(redis_url, prefix=redis_prefix)
    try:
        hit = Hit(Limit("2/minute"))
        for _ in range(2):
            await storage.decide(key, [hit])
        assert not (await storage.decide(key, [hit])).allowed
        assert _cli(redis_url, redis_prefix, "reset", f"key:{key}").returncode == 0
        assert (await storage.decide(key, [hit])).allowed
    finally:
        await storage.close()
    assert _cli(redis_url, redis_prefix, "delete", "api_key:acme").returncode == 0
    assert _cli(redis_url, redis_prefix, "get", "api_key:acme").returncode == 1


def test_bad_input_names_the_field(redis_url: str, redis_prefix: str) -> None:
    """A bad body exits 2 and says which field is wrong."""
    done = _cli(redis_url, redis_prefix, "set", '{"caller": "api_key:a", "tier": "x", '
                                                '"blocked_until": 1}')
    assert done.returncode == 2
    assert "override:" in done.stderr
    assert _cli("memory://", redis_prefix, "list").returncode == 2

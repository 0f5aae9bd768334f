"""The floors and the string-state experiment of ``redis_time.py``.

The guarantees' floor (``floor.lua``): per decision, only the Redis commands an
algorithm needs under ratelimit_mw's guarantees (windows aligned to Redis's clock,
every limit read before any is written) and its arithmetic, with no parsing and no
generic driver. The string-state experiment: our decision library with the fixed window
and the token bucket keeping one string written with ``SET ... PX`` where they keep a
hash written with ``HSET`` and ``PEXPIRE``, the rest unchanged (benchmark only: the
package's Lua is not touched).
"""

from __future__ import annotations

import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from ratelimit_mw import Hit
from ratelimit_mw.storage.keys import redis_key
from ratelimit_mw.storage.lease_ids import new_lease_id
from ratelimit_mw.storage.scripts import Library, decide_library
from ratelimit_mw.storage.wire import hit_arg

Step = Callable[[str], Awaitable[Any]]

# (label, function of floor.lua, keys, whether it takes a slot given back after)
GUARANTEE_FLOORS = [
    ("INCR + PEXPIRE and an unused TIME", "floor_incr_with_time", 1, False),
    ("fixed window: TIME, GET, SET PX or INCRBY", "floor_fixed_window", 1, False),
    ("fixed window, hash: TIME, HMGET, HSET (PEXPIRE)", "floor_fixed_window_hash", 1, False),
    ("fixed window, written first: TIME, INCRBY (PEXPIRE)",
     "floor_fixed_window_write_first", 1, False),
    ("token bucket: TIME, GET, SET PX", "floor_token_bucket", 1, False),
    ("GCRA: TIME, GET, SET PX", "floor_gcra", 1, False),
    ("sliding log: TIME, ZCOUNT, ZREMRANGEBYSCORE, ZADD, PEXPIRE", "floor_sliding_log", 1,
     False),
    ("sliding log, newest first: TIME, ZRANGE, (ZCOUNT, ZREM...,) ZADD, PEXPIRE",
     "floor_sliding_log_newest_first", 1, False),
    ("sliding-window counter: TIME, MGET, SET PX or INCRBY", "floor_sliding_window", 1, False),
    ("three limits: TIME, 3 reads, 3 writes", "floor_three_limits", 3, False),
    ("tier with slot and usage: TIME, 3 reads, 6-8 writes", "floor_tier", 3, True),
]

# Our decision's Lua (as decide_library() joins it) -> the same with string state.
STRING_STATE = [
    ('''  local saved = call("HMGET", key, "w", "c")
  local opened = num(saved[1]) ~= start
  if not opened then
    count = num(saved[2])
  end''', '''  local saved = call("GET", key)
  local space = saved and string.find(saved, " ", 1, true)
  local opened = not saved or num(string.sub(saved, 1, space - 1)) ~= start
  if not opened then
    count = num(string.sub(saved, space + 1))
  end'''),
    ('''    call("HSET", key, "w", text(start), "c", text(used))
    -- The key lives to the end of its window: set once, when the window opens.
    call("PEXPIRE", key, fmt(ttl_ms))
  else
    call("HSET", key, "c", text(used))''',
     '''    call("SET", key, text(start) .. " " .. text(used), "PX", fmt(ttl_ms))
  else
    call("SET", key, text(start) .. " " .. text(used), "KEEPTTL")'''),
    ('''  local saved = call("HMGET", key, "t", "l")
  local stored, last = tonumber(saved[1]), tonumber(saved[2])''',
     '''  local saved, stored, last = call("GET", key), nil, nil
  if saved then
    local space = string.find(saved, " ", 1, true)
    stored = tonumber(string.sub(saved, 1, space - 1))
    last = tonumber(string.sub(saved, space + 1))
  end'''),
    ('''  call("HSET", key, "t", tokens, "l", fmt(now))
  call("PEXPIRE", key, fmt(ttl_ms))''',
     '''  call("SET", key, tokens .. " " .. fmt(now), "PX", fmt(ttl_ms))'''),
]
STRING_STATE_CASES = ("fixed_window", "token_bucket", "three limits (bucket + day + hour)")


def guarantees_floor_library() -> str:
    return (Path(__file__).parent / "floor.lua").read_text(encoding="utf-8")


def floor_step(client: Any, function: str, prefix: str, keys: int, slot: bool) -> Step:
    """One call of ``function`` of floor.lua per key; with ``slot``, its slot (the
    third key) given back after, as ours is."""
    async def step(key: str) -> Any:
        names = [f"{prefix}{{{key}}}:{function}:{i}" for i in range(keys)]
        if not slot:
            return await client.fcall(function, keys, *names)
        lease = new_lease_id()
        reply = await client.fcall(function, keys, *names, lease)
        await client.zrem(names[2], lease)
        return reply

    return step


def string_state_library() -> Library:
    """Our decision library with string state (``STRING_STATE``), under its own name."""
    ours = decide_library()
    source = ours.source
    for old, new in STRING_STATE:
        if source.count(old) != 1:
            msg = f"the decision's Lua no longer holds {old.strip()[:60]!r}: update STRING_STATE"
            raise SystemExit(msg)
        source = source.replace(old, new)
    name, function = "bench_string_state", "bench_string_state_decide"
    return Library(source.replace(ours.function, function).replace(ours.name, name),
                   name, function)


def string_state_step(client: Any, function: str, prefix: str, hits: list[Hit]) -> Step:
    """One decision of ``hits`` per key, as ours sends it, by the string-state library."""
    args = ["", "", "", *map(hit_arg, hits)]

    async def step(key: str) -> Any:
        keys = [redis_key(prefix, key, hit.scope, hit.limit.uid) for hit in hits]
        return await client.fcall(function, len(keys), *keys, *args)

    return step

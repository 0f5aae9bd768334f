"""The Lua that runs on Redis, read from the package's ``storage/lua`` files.

A decision is a Redis Function (``FCALL``): its library is loaded once per server and
keeps its functions defined, where an ``EVALSHA`` would run the whole chunk again
(every algorithm's closures made anew) on each call. Settling and renewing, rarer,
stay scripts.
"""

from __future__ import annotations

from functools import cache
from hashlib import sha1
from importlib.resources import files
from typing import NamedTuple

from ..limits import ALGORITHM_NAMES

__all__ = ["Library", "decide_library", "decide_script_source", "lua_source",
           "renew_script_source", "settle_script_source"]

_ALGORITHMS = ("prelude", *ALGORITHM_NAMES, "concurrency", "calendar_month")


def lua_source(*names: str) -> str:
    """The Lua files ``names`` of ``storage/lua``, one after the other."""
    lua = files("ratelimit_mw.storage") / "lua"
    return "\n".join((lua / f"{name}.lua").read_text(encoding="utf-8") for name in names)


def decide_script_source() -> str:
    """The decision as a script: the prelude, one file per algorithm, the hits' parser,
    the usage history, then the driver (what ``decide_library`` loads, for servers and tools without
    Functions)."""
    return lua_source(*_ALGORITHMS, "hits", "usage", "decide")


class Library(NamedTuple):
    """A Redis Functions library, its name and the function a decision calls."""

    source: str
    name: str
    function: str


@cache
def decide_library() -> Library:
    """The decision as a Redis Functions library: the algorithm files run once, when it
    is loaded; the driver is its one function. Library and function are named after a
    digest of the source, so servers shared by two versions of ratelimit_mw hold both."""
    body = (lua_source(*_ALGORITHMS, "hits", "usage") + "\nlocal function decide(KEYS, ARGV)\n"
            + lua_source("decide") + "\nend\n")
    digest = sha1(body.encode(), usedforsecurity=False).hexdigest()[:16]
    name, function = f"ratelimit_mw_{digest}", f"ratelimit_mw_decide_{digest}"
    return Library(f"#!lua name={name}\n{body}"
                   f"redis.register_function('{function}', decide)\n", name, function)


def settle_script_source() -> str:
    """The settling script: the algorithms' helpers (the decision script's files), then
    settle.lua, whose twins of each algorithm's ``settle`` use them."""
    return lua_source("prelude", *ALGORITHM_NAMES, "calendar_month", "settle")


def renew_script_source() -> str:
    """The renewing script: the prelude (its clock), then renew.lua."""
    return lua_source("prelude", "renew")

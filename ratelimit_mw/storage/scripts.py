"""The Lua scripts that run on Redis, read from the package's ``storage/lua`` files."""

from __future__ import annotations

from importlib.resources import files

from ..limits import ALGORITHM_NAMES

__all__ = ["decide_script_source", "lua_source", "settle_script_source"]


def lua_source(*names: str) -> str:
    """The Lua files ``names`` of ``storage/lua``, one after the other."""
    lua = files("ratelimit_mw.storage") / "lua"
    return "\n".join((lua / f"{name}.lua").read_text(encoding="utf-8") for name in names)


def decide_script_source() -> str:
    """The decision script: the prelude, one file per algorithm, then the driver."""
    return lua_source("prelude", *ALGORITHM_NAMES, "concurrency", "calendar_month", "decide")


def settle_script_source() -> str:
    """The settling script: the algorithms' helpers (the decision script's files), then
    settle.lua, whose twins of each algorithm's ``settle`` use them."""
    return lua_source("prelude", *ALGORITHM_NAMES, "calendar_month", "settle")

"""Getting Redis ready before the first request: connect, learn the topology, load the
scripts, check the user may run what the library runs, and open connections.

Left to the first requests, this work (a TLS handshake, Cluster's slot map, a
``SCRIPT LOAD`` per primary) outlasts their per-decision timeout, and they are let
through undecided: at every deploy, restart and scale-up. Done here, at start-up,
the first request finds everything in place, and a wrong password or a missing ACL
permission shows before the server takes traffic.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster

from .wire import bulk, pack_function_load, pack_script_load

__all__ = ["WARM_CONNECTIONS", "pack_command", "probe_commands", "warm_client", "warm_cluster",
           "warm_pipeline"]

WARM_CONNECTIONS = 32
"""Connections opened at start-up per Redis server (Cluster: per primary) for the calls
that take one from a pool; a burst beyond them opens more as it goes."""


_ANY_NODE = ("FCALL", "EVALSHA", "TIME")  # probes that name no key: run on every primary


def pack_command(*args: bytes) -> bytes:
    """One command in RESP, packed by hand (for the pipelined connection)."""
    return b"*%d\r\n%b" % (len(args), b"".join(bulk(arg) for arg in args))


def probe_commands(decide: str, settle_sha: str, probe_key: str) -> list[tuple[bytes, ...]]:
    """Commands the library runs, each in a form that changes nothing, so that a user
    without the ACL permission for one is told at start-up (``NOPERM``): a decision of
    no limits (``FCALL``, which reads ``TIME``), a settlement of nothing (``EVALSHA``),
    a slot given back (``ZREM``), a
    usage read (``MGET``), a reset (``SCAN``, ``UNLINK``), all on a key no one uses."""
    key = probe_key.encode()
    return [(b"FCALL", decide.encode(), b"0", b"", b"", b""),
            (b"EVALSHA", settle_sha.encode(), b"0", b""), (b"TIME",),
            (b"ZREM", key, b"-"), (b"MGET", key), (b"UNLINK", key),
            (b"SCAN", b"0", b"MATCH", key, b"COUNT", b"1")]


async def warm_client(client: Redis, library: str, scripts: Sequence[str],
                      probes: list[tuple[bytes, ...]], connections: int) -> None:
    """Load ``library`` (Redis Functions) and ``scripts`` on one server, run the
    ``probes`` and open ``connections``."""
    await client.function_load(library, replace=True)
    for script in scripts:
        await client.script_load(script)
    for probe in probes:
        await client.execute_command(*probe)  # type: ignore[no-untyped-call]
    await _concurrently(connections, lambda: client.ping())


async def warm_pipeline(send: Callable[[bytes], Awaitable[Any]], library: str,
                        scripts: Sequence[str], probes: list[tuple[bytes, ...]]) -> None:
    """Load ``library`` and ``scripts`` and run the ``probes`` through the pipelined
    connection, each command ``send``'s (which sets the connection up)."""
    await send(pack_function_load(library))
    for script in scripts:
        await send(pack_script_load(script))
    for probe in probes:
        await send(pack_command(*probe))


async def warm_cluster(client: RedisCluster, library: str, scripts: Sequence[str],
                       probes: list[tuple[bytes, ...]], connections: int) -> None:
    """Learn the slot map, then on every primary load ``library`` and ``scripts``, run
    the probes that
    name no key and open ``connections``; the probes that name a key go where it
    lives."""
    await client.initialize()
    # The cluster client routes by the command's name, which it reads as text.
    commands = [tuple(arg.decode() for arg in probe) for probe in probes]
    for node in client.get_primaries():
        await client.execute_command("FUNCTION LOAD", "REPLACE", library, target_nodes=node)
        for script in scripts:
            await client.execute_command("SCRIPT LOAD", script, target_nodes=node)
        for command in commands:
            if command[0] in _ANY_NODE:
                await client.execute_command(*command, target_nodes=node)

        def ping(node: Any = node) -> Awaitable[Any]:
            return client.execute_command("PING", target_nodes=node)

        await _concurrently(connections, ping)
    for command in commands:
        if command[0] not in _ANY_NODE:
            await client.execute_command(*command)


async def _concurrently(count: int, call: Callable[[], Awaitable[Any]]) -> None:
    """``count`` calls at once, so each takes a connection of its own (kept in the pool)."""
    await asyncio.gather(*(call() for _ in range(count)))

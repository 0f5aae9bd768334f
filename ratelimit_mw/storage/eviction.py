"""Whether a Redis may evict our counters: read at start-up from ``INFO memory`` (which
managed services allow where ``CONFIG GET`` is refused), and said once in the log.

A Redis with ``maxmemory`` set and an evicting policy drops keys when it fills up:
``allkeys-*`` any key, ``volatile-*`` keys with a TTL, which every key of ours has. A
caller whose counters are dropped gets its whole quota again, and a concurrency slot
dropped is free for anyone. Under ``noeviction`` a full Redis refuses writes with
``OOM`` instead, which the failure policy answers and the metrics count.
"""

from __future__ import annotations

import logging
from typing import Any

from redis.asyncio.cluster import RedisCluster

from ..workers import claim_group_warning, sibling_workers
from .faults import REDIS_FAILURES

__all__ = ["SAFE_POLICY", "eviction_risk", "warn_if_evicting"]

_log = logging.getLogger("ratelimit_mw")

SAFE_POLICY = "noeviction"
"""The one ``maxmemory-policy`` under which Redis never drops a key of ours."""


def eviction_risk(info: dict[str, Any]) -> str | None:
    """What ``INFO memory``'s ``info`` means for our keys, or None when Redis can't
    evict them (no ``maxmemory``, or ``noeviction``)."""
    try:
        maxmemory = int(info.get("maxmemory", 0))
    except (TypeError, ValueError):
        return None
    policy = str(info.get("maxmemory_policy", SAFE_POLICY))
    if maxmemory <= 0 or policy == SAFE_POLICY:
        return None
    which = ("every key of ours has a TTL, so volatile-* policies evict them too"
             if policy.startswith("volatile-") else "allkeys-* policies evict any key")
    size = info.get("maxmemory_human") or f"{maxmemory}B"
    return (f"maxmemory={size} with maxmemory-policy={policy}: once full, Redis evicts "
            f"keys, rate-limit counters and concurrency slots among them ({which}), and a "
            f"caller whose counters are evicted gets its whole quota again; set "
            f"maxmemory-policy {SAFE_POLICY} (a full Redis then refuses writes with OOM, "
            f"which the failure policy answers) or use a Redis of its own")


async def warn_if_evicting(client: Any) -> str | None:
    """Read ``INFO memory`` of the server (Cluster: of each primary) and log a warning
    if it can evict our keys (once per group of workers); the warning's text, or None.
    A server that refuses ``INFO`` (an ACL without it) is not checked: start-up goes on."""
    try:
        if isinstance(client, RedisCluster):
            infos = [(node.name, await client.info("memory", target_nodes=node))
                     for node in client.get_primaries()]
        else:
            infos = [("", await client.info("memory"))]
    except REDIS_FAILURES as exc:
        _log.info("ratelimit_mw: couldn't read redis's maxmemory-policy (%s); eviction "
                  "not checked", exc)
        return None
    risks = sorted({risk for _, info in infos if (risk := eviction_risk(info)) is not None})
    if not risks:
        return None
    nodes = [name for name, info in infos if name and eviction_risk(info) is not None]
    where = f" (primaries {', '.join(nodes)})" if nodes else ""
    text = f"redis{where} has {'; '.join(risks)}"
    if sibling_workers() <= 1 or claim_group_warning("redis-evicts"):
        _log.warning("ratelimit_mw: %s", text,
                     extra={"ratelimit": {"event": "redis_may_evict"}})
    return text

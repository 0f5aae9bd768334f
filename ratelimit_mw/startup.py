"""Start-up: the storage checked and made ready before the server takes traffic.

At the ASGI lifespan start-up the middleware asks its storage to get ready (connect,
learn the topology, load scripts, open connections), within ``startup_timeout``.
A storage set up wrong (a wrong password, a missing ACL permission, a certificate
that fails verification, a refused database, a host that does not resolve) refuses
the start-up with one line. A storage merely unreachable or slow is a runtime
condition: the server starts, says so once, and the failure policy answers until the
storage does (unless ``require_storage`` is set: then it refuses too).
"""

from __future__ import annotations

import asyncio
import logging

from .errors import describe_error
from .storage import Storage
from .storage.faults import failure_cause, misconfiguration
from .workers import claim_group_warning, sibling_workers

__all__ = ["get_ready"]

_log = logging.getLogger("ratelimit_mw")


async def get_ready(storage: Storage, name: str, *, timeout: float, required: bool,
                    failure_mode: str) -> str | None:
    """Get ``storage`` (called ``name`` in messages) ready: None to serve, else the one
    line to refuse the start-up with."""
    if not storage.shared:
        _warn_if_workers(name)
    try:
        async with asyncio.timeout(timeout):
            await storage.prepare()
    except Exception as exc:  # any failure of a storage, custom ones included
        if isinstance(exc, TimeoutError):
            problem = f"not ready within startup_timeout={timeout:g} s"
        else:
            fault = misconfiguration(exc)
            if fault is not None:
                return f"ratelimit_mw: storage {name} is misconfigured: {fault}"
            what = "not reachable" if failure_cause(exc) == "connection" else "not ready"
            problem = f"{what} ({describe_error(exc)})"
        if required:
            return f"ratelimit_mw: storage {name} is {problem}, and require_storage is set"
        _log.warning("ratelimit_mw: storage %s is %s; serving anyway, failure_mode=%s "
                     "decides until it answers", name, problem, failure_mode)
    return None


def _warn_if_workers(name: str) -> None:
    """One warning per group of worker processes sharing a storage of one process."""
    workers = sibling_workers()
    if workers > 1 and claim_group_warning("memory-workers"):
        _log.warning(
            "ratelimit_mw: %d worker processes serve this app on storage %s, which is per "
            "process: each worker keeps its own rate limits, concurrency slots, idempotency "
            "records and circuit breakers, so a client gets up to %d times its limit and "
            "an Idempotency-Key can run once per worker; set RATELIMIT_STORAGE_URL to a "
            "Redis URL (redis://host:6379/0) to share them", workers, name, workers)

"""The app ``latency.py`` serves: the middleware over a storage already holding a big
heap of identities, and a probe of the event loop's pauses.

Read from the environment: ``BENCH_STORAGE`` (a storage URL, ``memory://`` or
``redis://…``), ``BENCH_KEYS`` (identities put in the storage at start-up),
``BENCH_FREEZE`` (``1``: ``gc.collect(); gc.freeze()`` at start-up, before the keys
arrive, as docs/deployment.md advises) and ``BENCH_PREFIX`` (the Redis key prefix).
Each request counts for the identity in its ``x-client`` header. ``GET /stats`` (exempt
from the limits) answers the probe's figures since the last ``GET /stats?reset=1``;
``GET /stats?collect=1`` also times a full garbage collection run there and then.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import os
import time
from collections.abc import AsyncIterator
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route
from starlette.types import Scope

from ratelimit_mw.events import DecisionEvent
from ratelimit_mw.middleware import RateLimitMiddleware
from ratelimit_mw.settings import RateLimitSettings
from ratelimit_mw.storage import storage_from_url
from ratelimit_mw.tiers import Tier

RATE = "1000000000/minute"
TICK = 0.001
"""Seconds the probe sleeps between looks at the clock."""
FILL_BATCH = 5000
"""Identities decided at once while filling a Redis storage."""


class Probe:
    """The longest pause of the event loop (a ticker's oversleep), the longest garbage
    collection (``gc.callbacks``), and the decisions not made by the storage.

    Pauses and collections are timed twice: on the wall clock, and in the CPU time of
    the server's thread. On a shared host the wall clock also counts the time the
    process waited for a core; the CPU time is the process's own work alone.
    """

    def __init__(self) -> None:
        self.reset()
        gc.callbacks.append(self._on_gc)
        self._gc_start = self._gc_start_cpu = 0.0

    def reset(self) -> None:
        self.pause = 0.0
        self.pause_cpu = 0.0
        self.gc_longest = 0.0
        self.gc_longest_cpu = 0.0
        self.gc_longest_generation = -1
        self.collections = [0, 0, 0]
        self.decisions = 0
        self.undecided: dict[str, int] = {}

    def _on_gc(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._gc_start, self._gc_start_cpu = time.perf_counter(), time.thread_time()
            return
        took = time.perf_counter() - self._gc_start
        generation = int(info["generation"])
        self.collections[generation] += 1
        if took > self.gc_longest:
            self.gc_longest, self.gc_longest_generation = took, generation
        self.gc_longest_cpu = max(self.gc_longest_cpu, time.thread_time() - self._gc_start_cpu)

    def on_decision(self, event: DecisionEvent) -> None:
        self.decisions += 1
        if event.source != "storage":
            self.undecided[event.source] = self.undecided.get(event.source, 0) + 1

    async def tick(self) -> None:
        """Sleep ``TICK`` over and over; the longest oversleep is the longest pause."""
        clock, cpu = time.perf_counter, time.thread_time
        while True:
            before, before_cpu = clock(), cpu()
            await asyncio.sleep(TICK)
            self.pause = max(self.pause, clock() - before - TICK)
            # The loop's own work between two ticks (a sleep costs no CPU time)
            self.pause_cpu = max(self.pause_cpu, cpu() - before_cpu)

    def figures(self) -> dict[str, object]:
        return {"loop_pause_ms": self.pause * 1000, "loop_pause_cpu_ms": self.pause_cpu * 1000,
                "gc_longest_ms": self.gc_longest * 1000,
                "gc_longest_cpu_ms": self.gc_longest_cpu * 1000,
                "gc_longest_generation": self.gc_longest_generation,
                "collections": self.collections, "decisions": self.decisions,
                "undecided": self.undecided, "tracked_objects": len(gc.get_objects())}


def _client_key(scope: Scope) -> str | None:
    for name, value in scope["headers"]:
        if name == b"x-client":
            return value.decode("latin-1")
    return None


async def _fill(middleware: RateLimitMiddleware, keys: int) -> None:
    """Decide once for each of ``keys`` identities, with the hits the middleware decides
    a request to ``/`` with (so the requests find these very counters)."""
    scope = {"type": "http", "method": "GET", "path": "/", "headers": [(b"x-client", b"c0")],
             "client": ("127.0.0.1", 1), "query_string": b""}
    charge = middleware.limiter.charge_now(scope)
    assert charge is not None
    hits = charge[1].hits
    storage = middleware.storage
    memory = storage.decide_now("warm", hits) is not None
    for start in range(0, keys, FILL_BATCH):
        names = [f"c{n}" for n in range(start, min(keys, start + FILL_BATCH))]
        if memory:
            for name in names:
                storage.decide_now(name, hits)
            await asyncio.sleep(0)
        else:
            await asyncio.gather(*(storage.decide(name, hits) for name in names))


def _middleware(app: Starlette) -> RateLimitMiddleware:
    """The app's RateLimitMiddleware (its stack is built before the lifespan runs)."""
    layer: Any = app.middleware_stack
    while not isinstance(layer, RateLimitMiddleware):
        layer = layer.app
    return layer


def create_app() -> Starlette:
    """The app of the environment's settings (uvicorn ``--factory`` entry point)."""
    probe = Probe()
    url = os.environ.get("BENCH_STORAGE", "memory://")
    keys = int(os.environ.get("BENCH_KEYS", "1000000"))
    if url.startswith("memory://"):
        storage = storage_from_url(url, max_keys=2 * keys + 1000)
    else:
        storage = storage_from_url(url, prefix=os.environ.get("BENCH_PREFIX", "latency:"))

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        if os.environ.get("BENCH_FREEZE") == "1":
            gc.collect()
            gc.freeze()
        began = time.perf_counter()
        await _fill(_middleware(app), keys)
        print(f"# filled {keys} identities in {time.perf_counter() - began:.1f} s",
              flush=True)
        ticker = asyncio.create_task(probe.tick())
        yield
        ticker.cancel()
        await storage.close()

    async def hello(request: Request) -> Response:
        return PlainTextResponse("hello")

    async def stats(request: Request) -> Response:
        figures = probe.figures()
        if request.query_params.get("reset"):
            probe.reset()
        if request.query_params.get("collect"):
            # What a full collection would cost now: none may come during a short run.
            began, began_cpu = time.perf_counter(), time.thread_time()
            gc.collect()
            figures["full_gc_ms"] = (time.perf_counter() - began) * 1000
            figures["full_gc_cpu_ms"] = (time.thread_time() - began_cpu) * 1000
        return PlainTextResponse(json.dumps(figures))

    app = Starlette(routes=[Route("/", hello), Route("/stats", stats)], lifespan=lifespan)
    app.add_middleware(RateLimitMiddleware, storage=storage, tiers=[Tier("t", RATE)],
                       key=_client_key, settings=RateLimitSettings(exempt_paths=["/stats"]),
                       on_decision=probe.on_decision)
    return app

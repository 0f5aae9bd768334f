"""This process's view of the overrides: what the limiter looks a caller up in.

A request costs one dict look-up here (plus a network match for ``ip:`` keys when
network overrides exist, remembered per key), never a storage call. A background task
keeps the view current: it reloads on every pub/sub announcement, and polls the
store's version every ``refresh_interval`` seconds for the announcements it missed.
While the store is unreachable the last known overrides stay in force; a Redis that
comes back empty is given them back.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import ipaddress
import logging
import math
import time
from collections.abc import Awaitable, Callable
from typing import Any

from ..errors import ConfigError, StorageError
from ..limit_sets import LimitSet, LimitSets
from ..routes import RouteSpec
from ..tiers import Tier, TierTable
from .model import Override, OverrideError
from .store import MemoryOverrideStore, OverrideStore, override_store_from_url

__all__ = ["Applied", "Overrides"]

_log = logging.getLogger("ratelimit_mw")
_MATCHES_KEPT = 10_000  # ip keys whose network match is remembered (then forgotten at once)
_CALL_TIMEOUT = 5.0  # seconds any one call to the store may take before it counts as failed


class Applied:
    """An override as this process applies it: the tier it gives (None: the caller's
    own, for a block) and the limit sets made for it, per tier and route."""

    __slots__ = ("_limit_sets", "blocked_until", "ends_at", "override", "tier")

    def __init__(self, override: Override, tier: Tier | None) -> None:
        self.override = override
        self.tier = tier
        self.ends_at = override.ends_at
        self.blocked_until = override.blocked_until or 0.0
        self._limit_sets: dict[tuple[str, RouteSpec], LimitSet] = {}

    def tier_for(self, own: Tier) -> Tier:
        """The tier a caller whose own tier is ``own`` counts on."""
        return self.tier if self.tier is not None else own

    def limit_set(self, own: Tier, route: RouteSpec, limit_sets: LimitSets) -> LimitSet:
        """The limit set of a request on ``route`` by a caller whose own tier is ``own``."""
        tier = self.tier if self.tier is not None else own
        limit_set = self._limit_sets.get((tier.name, route))
        if limit_set is None or limit_set.tier is not tier:
            limit_set = limit_sets.make(tier, route)
            if self.blocked_until:
                limit_set = dataclasses.replace(limit_set, blocked_until=self.blocked_until)
            self._limit_sets[(tier.name, route)] = limit_set
        return limit_set


class Overrides:
    """Every override, as this process applies them, kept in step with ``store``.

    Give it to the middleware (``RateLimitMiddleware(app, overrides=overrides)``);
    change overrides with ``set`` and ``delete`` (or the admin API), from any worker.
    """

    def __init__(self, store: OverrideStore | None = None, *, refresh_interval: float = 0.5,
                 clock: Callable[[], float] = time.time) -> None:
        if not 0 < refresh_interval <= 60:
            msg = f"refresh_interval must be from 0 to 60 seconds, got {refresh_interval!r}"
            raise ConfigError(msg)
        self.store = store if store is not None else MemoryOverrideStore()
        self.refresh_interval = refresh_interval
        self.clock = clock
        self.tiers: TierTable | None = None
        self.version = 0
        self._overrides: dict[str, Override] = {}
        self._exact: dict[str, Applied] = {}
        self._networks: list[tuple[Any, Applied]] = []
        self._matched: dict[str, Applied | None] = {}
        self._reported: set[str] = set()
        self._on_reset: Callable[[str], None] | None = None
        self._task: asyncio.Task[None] | None = None
        self._synced = isinstance(self.store, MemoryOverrideStore)  # nothing to follow
        self._failing = False

    @classmethod
    def from_url(cls, url: str, *, prefix: str = "ratelimit:",
                 refresh_interval: float = 0.5) -> Overrides:
        """Overrides kept where a storage URL points (memory://, redis://, Cluster,
        Sentinel)."""
        return cls(override_store_from_url(url, prefix=prefix), refresh_interval=refresh_interval)

    def __repr__(self) -> str:
        return (f"Overrides({type(self.store).__name__}, {len(self._overrides)} overrides, "
                f"version={self.version})")

    # -- the request path ------------------------------------------------------------

    def attach(self, tiers: TierTable, on_reset: Callable[[str], None] | None = None) -> None:
        """Apply the overrides against ``tiers`` (the middleware's); ``on_reset(key)``
        is told of counters reset through any worker (to drop what it kept of them)."""
        if self.tiers is not None and self.tiers is not tiers:
            msg = "these Overrides already serve another middleware; give each its own"
            raise ConfigError(msg)
        self.tiers = tiers
        self._on_reset = on_reset
        self._rebuild()

    def find(self, key: str) -> Applied | None:
        """The override in force for ``key``, if any (no storage call)."""
        if not self._synced:
            self._start()
        applied = self._exact.get(key)
        if applied is None:
            if not self._networks or not key.startswith("ip:"):
                return None
            applied = self._network_match(key)
            if applied is None:
                return None
        if applied.ends_at != math.inf and self.clock() >= applied.ends_at:
            return None  # expired: the caller is back on its own tier
        return applied

    def _network_match(self, key: str) -> Applied | None:
        if key in self._matched:
            return self._matched[key]
        try:
            address = ipaddress.ip_network(key[3:], strict=False)
        except ValueError:
            address = None
        found: Applied | None = None
        if address is not None:
            for network, applied in self._networks:
                if address.version == network.version and address.subnet_of(network):
                    found = applied
                    break
        if len(self._matched) >= _MATCHES_KEPT:
            self._matched.clear()
        self._matched[key] = found
        return found

    # -- keeping the view --------------------------------------------------------------

    def _rebuild(self) -> None:
        """The look-up tables, from the overrides and the tiers."""
        exact: dict[str, Applied] = {}
        networks: list[tuple[Any, Applied]] = []
        for override in self._overrides.values():
            applied = self._applied(override)
            if applied is None:
                continue
            if override.network is not None:
                networks.append((override.network, applied))
            else:
                exact[override.caller] = applied
        networks.sort(key=lambda item: -item[0].prefixlen)  # the most specific first
        self._exact, self._networks, self._matched = exact, networks, {}

    def _applied(self, override: Override) -> Applied | None:
        if override.tier is None:
            return Applied(override, None if override.blocks else override.custom_tier())
        tier = self.tiers.tiers.get(override.tier) if self.tiers is not None else None
        if tier is None:
            if self.tiers is not None and override.caller not in self._reported:
                self._reported.add(override.caller)
                _log.error("ratelimit_mw: the override of %s names unknown tier %r; "
                           "ignored", override.caller, override.tier)
            return None
        return Applied(override, tier)

    def _replace(self, version: int, overrides: list[Override]) -> None:
        self.version = version
        self._overrides = {override.caller: override for override in overrides}
        self._rebuild()

    async def refresh(self) -> None:
        """Reload the overrides from the store (StorageError when it can't be read)."""
        version, overrides = await self.store.load()
        if version == 0 and self.version and self._overrides:
            # The store lost everything (a Redis restarted without persistence): what
            # this worker knows is the newest there is.
            _log.warning("ratelimit_mw: the override store came back empty; writing back "
                         "the %d overrides this worker knows", len(self._overrides))
            await self.store.restore(list(self._overrides.values()))
            version, overrides = await self.store.load()
        self._replace(version, overrides)

    def _start(self) -> None:
        """Follow the store from a task of the running loop (from the first request)."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        self._synced = True
        self._task = loop.create_task(self._follow(), name="ratelimit_mw overrides")

    async def start(self) -> None:
        """Load the overrides now and follow the store (else done at the first request)."""
        if self._task is None and not isinstance(self.store, MemoryOverrideStore):
            with contextlib.suppress(StorageError, TimeoutError):
                async with asyncio.timeout(_CALL_TIMEOUT):
                    await self.refresh()
            self._start()

    async def _follow(self) -> None:
        # The loop also ends by itself once close() has let go of its task: redis-py's
        # pub/sub can swallow a cancellation that lands as its read times out, and a
        # follower that missed its cancel would otherwise go on for good.
        store, me = self.store, asyncio.current_task()
        while self._task is me:
            subscriber = store.subscriber()
            try:
                async with asyncio.timeout(_CALL_TIMEOUT):
                    if subscriber is not None:
                        await subscriber.subscribe(store.channel)
                    await self.refresh()  # after subscribing: no change falls in between
                if self._failing:
                    self._failing = False
                    _log.warning("ratelimit_mw: the override store answers again")
                while self._task is me:
                    if subscriber is None:
                        await asyncio.sleep(self.refresh_interval)
                    async with asyncio.timeout(self.refresh_interval + _CALL_TIMEOUT):
                        if subscriber is not None:
                            message = await subscriber.get_message(
                                ignore_subscribe_messages=True, timeout=self.refresh_interval)
                            if message is not None:
                                await self._told(message.get("data"))
                                continue
                        if await store.version() != self.version:
                            await self.refresh()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # a storage or connection error: keep the view
                if self._task is not me:
                    return
                if not self._failing:
                    self._failing = True
                    _log.warning("ratelimit_mw: can't follow the override store (%s: %s); "
                                 "the %d overrides known stay in force", type(exc).__name__,
                                 str(exc)[:200], len(self._overrides))
            finally:
                if subscriber is not None:
                    with contextlib.suppress(Exception):
                        async with asyncio.timeout(_CALL_TIMEOUT):
                            await subscriber.aclose()
            if self._task is me:
                await asyncio.sleep(self.refresh_interval)

    async def _told(self, data: object) -> None:
        """Act on an announcement: counters reset, or overrides changed."""
        if isinstance(data, bytes) and data.startswith(b"reset:"):
            if self._on_reset is not None:
                self._on_reset(data[6:].decode("utf-8", "surrogateescape"))
            return
        await self.refresh()

    async def reset(self, key: str, clear: Callable[[], Awaitable[None]], *,
                    by: str = "") -> None:
        """Forget the counters of ``key`` (``clear`` does it in the storage), and tell
        every worker to drop the denials it kept for it."""
        await clear()
        if self._on_reset is not None:
            self._on_reset(key)
        await self.store.announce(f"reset:{key}")
        log_reset(by, key)

    async def close(self) -> None:
        """Stop following the store and close it."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()  # a follower that misses it still stops by its next read's end
            await asyncio.wait({task}, timeout=self.refresh_interval + _CALL_TIMEOUT)
        with contextlib.suppress(StorageError, TimeoutError):
            async with asyncio.timeout(_CALL_TIMEOUT):
                await self.store.close()

    # -- changes ---------------------------------------------------------------------

    def check(self, override: Override) -> None:
        """An OverrideError for an override this process could not apply."""
        tiers = self.tiers
        if override.tier is not None and tiers is not None and override.tier not in tiers.tiers:
            raise OverrideError("tier", f"unknown tier {override.tier!r}; known tiers: "
                                        f"{', '.join(tiers.tiers)}")
        now = self.clock()
        for name in ("expires_at", "blocked_until"):
            value = getattr(override, name)
            if value is not None and value <= now:
                raise OverrideError(name, "must be in the future")

    async def set(self, override: Override, *, by: str = "") -> Override | None:
        """Store ``override`` for every worker; returns the one it replaced."""
        self.check(override)
        before = await self.store.set(override)
        self._overrides[override.caller] = override
        self._rebuild()
        _log_change("set", by, override.caller, before, override)
        return before

    async def delete(self, caller: str, *, by: str = "") -> Override | None:
        """Remove the override of ``caller`` for every worker; returns it (None: none)."""
        before = await self.store.delete(caller)
        if self._overrides.pop(caller, None) is not None:
            self._rebuild()
        if before is not None:
            _log_change("delete", by, caller, before, None)
        return before

    async def get(self, caller: str) -> Override | None:
        """The stored override of ``caller`` (expired ones too, until deleted)."""
        _, overrides = await self.store.load()
        return next((o for o in overrides if o.caller == caller), None)

    async def all(self) -> list[Override]:
        """Every stored override."""
        _, overrides = await self.store.load()
        return sorted(overrides, key=lambda o: o.caller)

    def known(self) -> list[Override]:
        """The overrides this process applies (without asking the store)."""
        return list(self._overrides.values())


def _log_change(action: str, by: str, caller: str, before: Override | None,
                after: Override | None) -> None:
    """One structured line per change: who, what, before and after."""
    record = {"event": f"override_{action}", "who": by or "-", "caller": caller,
              "before": before.to_dict() if before is not None else None,
              "after": after.to_dict() if after is not None else None}
    _log.info("ratelimit_mw override event=%s who=%s caller=%s before=%s after=%s",
              record["event"], record["who"], caller,
              before.describe() if before is not None else "-",
              after.describe() if after is not None else "-",
              extra={"ratelimit": record})


def log_reset(by: str, caller: str) -> None:
    """The line for counters cleared by an operator."""
    _log.info("ratelimit_mw override event=counters_reset who=%s caller=%s before=- after=-",
              by or "-", caller, extra={"ratelimit": {
                  "event": "counters_reset", "who": by or "-", "caller": caller,
                  "before": None, "after": None}})

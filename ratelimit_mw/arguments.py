"""What a ``RateLimitMiddleware`` is given, checked as it is made: the objects passed in
(a TypeError naming any that can't do its job), the storage each limit needs, the
storage made from the settings, the decision hooks joined into one."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from .callbacks import is_async_callable
from .errors import ConfigError
from .events import DecisionEvent, DecisionHook
from .metrics import Metrics
from .settings import RateLimitSettings
from .storage import Storage, storage_from_url

if TYPE_CHECKING:
    from .limiter import Limiter

__all__ = ["both", "check_objects", "check_settles", "storage_from"]


def both(first: DecisionHook, second: DecisionHook) -> DecisionHook:
    """One decision hook that runs ``first``, then ``second``."""
    def both(event: DecisionEvent) -> None:
        first(event)
        second(event)

    return both


def check_objects(*, settings: object, storage: object, breaker: object, metrics: object,
                   **callables: object) -> None:
    """A TypeError naming any argument given as an object that can't do its job (it
    would otherwise fail on the first request, or never)."""
    if settings is not None and not isinstance(settings, RateLimitSettings):
        msg = f"settings must be a RateLimitSettings, got {settings!r}"
        raise TypeError(msg)
    if storage is not None and not isinstance(storage, Storage):
        msg = f"storage must be a ratelimit_mw Storage (e.g. MemoryStorage()), got {storage!r}"
        raise TypeError(msg)
    if metrics is not None and not isinstance(metrics, Metrics):
        msg = (f"metrics must be a ratelimit_mw.metrics.Metrics (e.g. PrometheusMetrics()), "
               f"got {metrics!r}")
        raise TypeError(msg)
    if breaker is not None and not callable(getattr(breaker, "try_acquire", None)):
        msg = f"breaker must be a circuit breaker (e.g. CircuitBreaker()), got {breaker!r}"
        raise TypeError(msg)
    for name, value in callables.items():
        if value is not None and not callable(value):
            msg = f"{name} must be a callable, got {value!r}"
            raise TypeError(msg)
    on_decision = callables.get("on_decision")
    if on_decision is not None and is_async_callable(on_decision):
        # It would never be awaited: no metrics, and a warning per request.
        msg = (f"on_decision must be a plain (not async) function, got {on_decision!r}: it "
               f"runs on every decision; hand slow work to a queue or a task of your own")
        raise TypeError(msg)


def check_settles(storage: Storage, limiter: Limiter) -> None:
    """A ConfigError when a limit settles its charge after the response (``count=``,
    ``cost=``) on a storage that can't."""
    if storage.settles:
        return
    hits = [hit for tier in limiter.tiers.tiers.values() for hit in tier.hits]
    hits += [hit for spec in limiter.routes.known_specs() for hit in spec.hits]
    for hit in hits:
        if hit.limit.settlement is not None:
            msg = (f"limit {hit.limit.name!r} ({hit.limit}) settles its charge after the "
                   f"response ({hit.limit.settlement!r}), which {type(storage).__name__} "
                   f"can't do; use MemoryStorage or RedisStorage")
            raise ConfigError(msg)


def storage_from(settings: RateLimitSettings, clock: Callable[[], float]) -> Storage:
    """The storage of ``settings.storage_url`` (memory on ``clock``)."""
    url = settings.storage_url
    retention = settings.usage_retention
    if url.lower().startswith("memory://"):
        return storage_from_url(url, clock=clock, usage_retention=retention)
    return storage_from_url(url, prefix=settings.storage_prefix,
                            timeout=settings.storage_timeout,
                            connect_timeout=settings.storage_connect_timeout,
                            usage_retention=retention)

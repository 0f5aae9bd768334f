"""Idempotency records in Redis: one script call per step, TTLs on every key.

On a single server, Redis Cluster or the primary Sentinel names, from the same URLs
as the rate limiter's storage.
"""

from __future__ import annotations

import asyncio
import math
import uuid
from importlib.resources import files
from typing import Any

from redis import exceptions as redis_errors
from redis.asyncio import Redis
from redis.commands.core import AsyncScript

from ..breaker import CircuitBreaker, Gate
from ..checks import positive_seconds
from ..errors import ConfigError, StorageError
from ..storage.cluster import CLUSTER_SCHEMES, cluster_client_from_url
from ..storage.sentinel import SENTINEL_SCHEMES, sentinel_client_from_url
from ..storage.urls import redacted
from .store import Claim, IdempotencyStore, StoredResponse

__all__ = ["DEFAULT_RECOVERY_INTERVAL", "DEFAULT_TIMEOUT", "RedisIdempotencyStore", "script_source"]

DEFAULT_TIMEOUT = 0.25
"""Seconds one store call may take; see `RedisIdempotencyStore` for why this much."""
DEFAULT_RECOVERY_INTERVAL = 2.0
"""Seconds the breaker refuses calls after it opens, before one trial call (the rate
limiter's ``recovery_interval``)."""

_FAILURES = (redis_errors.RedisError, OSError, asyncio.TimeoutError)


def script_source(name: str) -> str:
    """The Lua source of one operation (``claim``, ``complete``, ``renew``, ``release``),
    package data."""
    return (files(__package__) / "lua" / f"{name}.lua").read_text(encoding="utf-8")


def _ms(seconds: float) -> int:
    """Whole milliseconds for PEXPIRE, rounded up and never 0."""
    return max(1, math.ceil(seconds * 1000))


def _client_from_url(url: str, timeout: float, options: dict[str, Any]) -> Any:
    """A client for any Redis URL the rate limiter's storage takes, built the same way."""
    scheme = url.split("://", 1)[0].lower() if isinstance(url, str) and "://" in url else ""
    if scheme in CLUSTER_SCHEMES:
        return cluster_client_from_url(url, timeout=timeout, **options)
    if scheme in SENTINEL_SCHEMES:
        return sentinel_client_from_url(url, timeout=timeout, **options)
    if scheme not in ("redis", "rediss"):
        msg = (f"couldn't keep idempotency records at {redacted(url)}; expected a redis://, "
               f"rediss://, redis+cluster://, rediss+cluster:// or redis+sentinel:// URL")
        raise ConfigError(msg)
    options.setdefault("socket_timeout", timeout)
    options.setdefault("socket_connect_timeout", timeout)
    try:
        return Redis.from_url(url, **options)
    except (ValueError, TypeError) as exc:
        msg = f"couldn't keep idempotency records at {redacted(url)}: {exc}"
        raise ConfigError(msg) from exc


class RedisIdempotencyStore(IdempotencyStore):
    """Keys and responses shared by every worker that uses the same Redis.

    A record is one hash at ``prefix + key`` (the key is the middleware's
    hash of caller and Idempotency-Key, so client bytes never reach the key
    name), always with a TTL: the lease while in flight, ``ttl`` once done.
    The client must return bytes (``decode_responses=False``): bodies are binary.
    Redis errors are raised as ``StorageError``.

    Every call, on a client of the store's own or on one passed in, is bounded
    by ``timeout`` seconds (``DEFAULT_TIMEOUT``, 0.25) and goes through
    ``breaker``, as the rate limiter's storage calls do (``ratelimit_mw.failure``):
    after 3 calls of which at least half failed, calls are refused at once with
    a ``StorageError`` for ``recovery_interval`` seconds (2), then one trial call
    tests Redis and closes the breaker if it answers. So while Redis is down or
    frozen, a keyed request pays the timeout only now and then, and the
    middleware answers it (503, or the request runs with ``fail_open``) at once.
    Pass ``breaker`` (a ``ratelimit_mw.breaker.CircuitBreaker``) to tune or watch it.
    A call that timed out may still run when a frozen Redis resumes: a claim then
    holds its key until ``lock_ttl`` runs out (409s meanwhile, never a second run).

    The default timeout is five times the rate limiter's 0.05 s because this is a
    write path: ``complete`` carries the whole response (up to 1 MiB by default)
    and the first call of a connection also connects (TLS with ``rediss://``)
    and may load the script. A call cut short costs more here, too: a claim
    refused is a 503 the client retries, but a response not stored keeps its key
    locked until the release, or the lease, frees it. Yet 0.25 s is short next to
    the time a client waits for an answer, so a frozen Redis never hangs it.
    """

    __slots__ = (
        "_claim", "_client", "_complete", "_owns_client", "_release", "_renew", "breaker",
        "prefix", "timeout",
    )

    def __init__(
        self,
        client: Redis | Any,
        *,
        prefix: str = "idempotency:",
        owns_client: bool = False,
        timeout: float = DEFAULT_TIMEOUT,
        recovery_interval: float = DEFAULT_RECOVERY_INTERVAL,
        breaker: Gate | None = None,
    ) -> None:
        if not isinstance(prefix, str) or "{" in prefix or "}" in prefix:
            msg = f"key prefix {prefix!r} must be a string without '{{' or '}}'"
            raise ConfigError(msg)
        self.timeout = positive_seconds("idempotency store timeout", timeout)
        cooldown = positive_seconds("recovery interval", recovery_interval)
        if breaker is not None and not callable(getattr(breaker, "try_acquire", None)):
            msg = f"breaker must be a CircuitBreaker (or have try_acquire()), got {breaker!r}"
            raise ConfigError(msg)
        pool = getattr(client, "connection_pool", None)
        if pool is not None and pool.connection_kwargs.get("decode_responses"):
            msg = "the Redis client must use decode_responses=False: stored bodies are bytes"
            raise ConfigError(msg)
        self.prefix = prefix
        self.breaker: Gate = breaker if breaker is not None else CircuitBreaker(
            name="idempotency-store", window_size=10, minimum_calls=3,
            failure_rate_threshold=50.0, cooldown=cooldown,
            probe_timeout=max(1.0, 10 * self.timeout),
        )
        self._client = client
        self._owns_client = owns_client
        self._claim: AsyncScript = client.register_script(script_source("claim"))
        self._complete: AsyncScript = client.register_script(script_source("complete"))
        self._renew: AsyncScript = client.register_script(script_source("renew"))
        self._release: AsyncScript = client.register_script(script_source("release"))

    @classmethod
    def from_url(
        cls,
        url: str,
        *,
        prefix: str = "idempotency:",
        timeout: float = DEFAULT_TIMEOUT,
        recovery_interval: float = DEFAULT_RECOVERY_INTERVAL,
        breaker: Gate | None = None,
        **options: Any,
    ) -> RedisIdempotencyStore:
        """Connect lazily to any Redis the rate limiter's storage URLs name: ``redis://``,
        ``rediss://``, ``redis+cluster://``, ``rediss+cluster://`` or ``redis+sentinel://``
        (with the same query options); another scheme is a ``ConfigError`` naming the URL.

        ``timeout`` bounds each call, and is the socket timeouts unless ``options`` set them.
        """
        timeout = positive_seconds("idempotency store timeout", timeout)
        client = _client_from_url(url, timeout, {**options, "decode_responses": False})
        return cls(client, prefix=prefix, owns_client=True, timeout=timeout,
                   recovery_interval=recovery_interval, breaker=breaker)

    def __repr__(self) -> str:
        return (f"RedisIdempotencyStore(prefix={self.prefix!r}, timeout={self.timeout:g}, "
                f"breaker={self.breaker!r}, client={self._client!r})")

    async def _run(self, doing: str, script: AsyncScript, key: str, args: list[Any]) -> Any:
        """One script call under the timeout and through the breaker; else a StorageError."""
        permit = self.breaker.try_acquire()
        if permit is None:
            wait = self.breaker.remaining_cooldown
            when = f"next try in {wait:.1f} s" if wait else "a trial call is testing it"
            msg = f"redis could not {doing}: not tried, Redis failed repeatedly ({when})"
            raise StorageError(msg)
        try:
            async with asyncio.timeout(self.timeout):
                reply = await script(keys=[self.prefix + key], args=args)
        except _FAILURES as exc:
            permit.record_failure()
            reason = str(exc) or f"no answer within {self.timeout:g} s"
            msg = f"redis could not {doing}: {reason}"
            raise StorageError(msg) from exc
        except BaseException:
            # Cancelled (the client left) or a bug: says nothing about Redis.
            permit.release()
            raise
        permit.record_success()
        return reply

    async def claim(self, key: str, fingerprint: str, *, lock_ttl: float) -> Claim:
        token = uuid.uuid4().hex
        args = [fingerprint, token, _ms(lock_ttl)]
        reply = await self._run("claim an idempotency key", self._claim, key, args)
        outcome = reply[0].decode()
        if outcome == "claimed":
            return Claim("claimed", token)
        if outcome in ("in_flight", "mismatch"):
            return Claim(outcome)
        status, headers, body = reply[1:4]
        response = StoredResponse(int(status), StoredResponse.headers_from_json(headers), body)
        return Claim("done", response=response)

    async def complete(
        self, key: str, token: str, fingerprint: str, response: StoredResponse, *, ttl: float
    ) -> bool:
        args: list[Any] = [
            token, fingerprint, _ms(ttl), response.status, response.headers_json(),
            response.body,
        ]
        return bool(await self._run("store an idempotent response", self._complete, key, args))

    async def renew(self, key: str, token: str, *, lock_ttl: float) -> bool:
        args = [token, _ms(lock_ttl)]
        return bool(await self._run("renew an idempotency lease", self._renew, key, args))

    async def release(self, key: str, token: str) -> None:
        await self._run("release an idempotency key", self._release, key, [token])

    @property
    def retry_after(self) -> int:
        """Whole seconds until the breaker lets a call through again (at least 1)."""
        return max(1, math.ceil(self.breaker.remaining_cooldown))

    async def close(self) -> None:
        """Close the client if this store created it."""
        if self._owns_client:
            await self._client.aclose()

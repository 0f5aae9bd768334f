"""Idempotency records in Redis: one script call to claim, one to complete, TTLs on every key."""

from __future__ import annotations

import asyncio
import math
import uuid
from importlib.resources import files
from typing import Any

from redis import exceptions as redis_errors
from redis.asyncio import Redis
from redis.commands.core import AsyncScript

from ..errors import ConfigError, StorageError
from .store import Claim, IdempotencyStore, StoredResponse

__all__ = ["RedisIdempotencyStore", "script_source"]

_FAILURES = (redis_errors.RedisError, OSError, asyncio.TimeoutError)


def script_source(name: str) -> str:
    """The Lua source of one operation (``claim``, ``complete``, ``release``), package data."""
    return (files(__package__) / "lua" / f"{name}.lua").read_text(encoding="utf-8")


def _ms(seconds: float) -> int:
    """Whole milliseconds for PEXPIRE, rounded up and never 0."""
    return max(1, math.ceil(seconds * 1000))


class RedisIdempotencyStore(IdempotencyStore):
    """Keys and responses shared by every worker that uses the same Redis.

    A record is one hash at ``prefix + key`` (the key is the middleware's
    hash of caller and Idempotency-Key, so client bytes never reach the key
    name), always with a TTL: the lease while in flight, ``ttl`` once done.
    The client must return bytes (``decode_responses=False``): bodies are binary.
    Redis errors are raised as ``StorageError``.
    """

    __slots__ = ("_claim", "_client", "_complete", "_owns_client", "_release", "prefix")

    def __init__(
        self, client: Redis | Any, *, prefix: str = "idempotency:", owns_client: bool = False
    ) -> None:
        if not isinstance(prefix, str) or "{" in prefix or "}" in prefix:
            msg = f"key prefix {prefix!r} must be a string without '{{' or '}}'"
            raise ConfigError(msg)
        pool = getattr(client, "connection_pool", None)
        if pool is not None and pool.connection_kwargs.get("decode_responses"):
            msg = "the Redis client must use decode_responses=False: stored bodies are bytes"
            raise ConfigError(msg)
        self.prefix = prefix
        self._client = client
        self._owns_client = owns_client
        self._claim: AsyncScript = client.register_script(script_source("claim"))
        self._complete: AsyncScript = client.register_script(script_source("complete"))
        self._release: AsyncScript = client.register_script(script_source("release"))

    @classmethod
    def from_url(
        cls, url: str, *, prefix: str = "idempotency:", timeout: float | None = None,
        **options: Any,
    ) -> RedisIdempotencyStore:
        """Connect lazily to ``redis://`` or ``rediss://``; ``timeout`` bounds each call."""
        if timeout is not None:
            options.setdefault("socket_timeout", timeout)
            options.setdefault("socket_connect_timeout", timeout)
        options["decode_responses"] = False
        return cls(Redis.from_url(url, **options), prefix=prefix, owns_client=True)

    def __repr__(self) -> str:
        return f"RedisIdempotencyStore(prefix={self.prefix!r}, client={self._client!r})"

    async def claim(self, key: str, fingerprint: str, *, lock_ttl: float) -> Claim:
        token = uuid.uuid4().hex
        try:
            reply = await self._claim(
                keys=[self.prefix + key], args=[fingerprint, token, _ms(lock_ttl)]
            )
        except _FAILURES as exc:
            msg = f"redis could not claim an idempotency key: {exc}"
            raise StorageError(msg) from exc
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
        args: list[str | int | bytes] = [
            token, fingerprint, _ms(ttl), response.status, response.headers_json(),
            response.body,
        ]
        try:
            return bool(await self._complete(keys=[self.prefix + key], args=args))
        except _FAILURES as exc:
            msg = f"redis could not store an idempotent response: {exc}"
            raise StorageError(msg) from exc

    async def release(self, key: str, token: str) -> None:
        try:
            await self._release(keys=[self.prefix + key], args=[token])
        except _FAILURES as exc:
            msg = f"redis could not release an idempotency key: {exc}"
            raise StorageError(msg) from exc

    async def close(self) -> None:
        """Close the client if this store created it."""
        if self._owns_client:
            await self._client.aclose()

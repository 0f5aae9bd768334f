"""Waiting for a connection to Redis Cluster or Sentinel: a queue for turns, a short retry."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable
from contextlib import asynccontextmanager
from typing import TypeVar

from redis.asyncio.connection import Connection, SSLConnection
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialWithJitterBackoff
from redis.exceptions import ConnectionError as RedisConnectionError

__all__ = ["ConnectionQueue", "PatientConnection", "PatientSSLConnection", "answer_within",
           "short_retry"]

T = TypeVar("T")


class ConnectionQueue:
    """At most ``size`` commands in flight; the others wait up to ``timeout`` s for a turn.

    redis-py's cluster and Sentinel clients raise ``MaxConnectionsError`` at once
    when every connection is busy; with this queue a burst larger than the pool
    waits instead, like ``redis://`` with its blocking pool.
    """

    __slots__ = ("_semaphore", "size", "timeout")

    def __init__(self, size: int, timeout: float) -> None:
        self.size = size
        self.timeout = timeout
        self._semaphore: asyncio.Semaphore | None = None

    def __repr__(self) -> str:
        return f"ConnectionQueue(size={self.size}, timeout={self.timeout})"

    @asynccontextmanager
    async def turn(self) -> AsyncIterator[None]:
        """Hold one of the ``size`` turns for the duration of a command."""
        if self._semaphore is None:
            self._semaphore = asyncio.Semaphore(self.size)
        try:
            async with asyncio.timeout(self.timeout):
                await self._semaphore.acquire()
        except TimeoutError as exc:
            msg = f"no free connection within {self.timeout} s ({self.size} in use)"
            raise RedisConnectionError(msg) from exc
        try:
            yield
        finally:
            self._semaphore.release()


def short_retry() -> Retry:
    """Three quick retries (10 ms to 250 ms apart): a rate limiter must answer fast."""
    return Retry(ExponentialWithJitterBackoff(base=0.01, cap=0.25), retries=3)


class _PatientHandshake:
    """A connection whose handshake's replies (AUTH, HELLO, SELECT) are bounded by the
    connect timeout, not the read timeout: they are part of connecting."""

    socket_timeout: float | None
    socket_connect_timeout: float | None

    async def on_connect_check_health(self, check_health: bool = True) -> None:
        read_timeout = self.socket_timeout
        connect_timeout = self.socket_connect_timeout
        if read_timeout is not None and connect_timeout is not None:
            self.socket_timeout = max(read_timeout, connect_timeout)
        try:
            await super().on_connect_check_health(check_health)  # type: ignore[misc]
        finally:
            self.socket_timeout = read_timeout


class PatientConnection(_PatientHandshake, Connection):
    """``Connection`` with a patient handshake."""


class PatientSSLConnection(_PatientHandshake, SSLConnection):
    """``SSLConnection`` with a patient handshake."""


async def answer_within(call: Awaitable[T], wait: float | None) -> T:
    """The answer of ``call``, or ``TimeoutError`` when there is none ``wait`` seconds on.

    Unlike ``asyncio.timeout``, an answer that came in time, but was still unread when
    the deadline passed (this process was busy, or not scheduled: a burst, a loaded
    host), is taken: the deadline is looked at after the replies already received
    have been read, as the pipelined connection does. The storage was not slow.
    """
    if wait is None:
        return await call
    task = asyncio.ensure_future(call)
    try:
        await asyncio.wait((task,), timeout=wait)
    except BaseException:
        task.cancel()
        raise
    if task.done():
        return task.result()
    task.cancel()
    raise TimeoutError

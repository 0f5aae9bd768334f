"""Redis servers set up the ways a deploy gets wrong, and an ASGI lifespan driver.

``locked_redis`` needs a password (``--requirepass``) and has ACL users each lacking
one command; ``tls_redis`` serves TLS with a certificate of a throwaway CA (made with
``openssl``). Both are torn down with their directories by their context managers.
"""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

from starlette.types import ASGIApp, Message

from tests.conftest import free_port
from tests.redis_servers import (
    ClusterDeployment,
    RedisProcess,
    StartupError,
    cluster_node,
    redis_server_binary,
)

__all__ = ["LACKING", "PASSWORD", "USER_PASSWORD", "TLSRedis", "cluster_replica", "lifespan",
           "locked_redis", "tls_redis"]

PASSWORD = "s3cret-pw"
USER_PASSWORD = "user-pw"
# ACL users of locked_redis: each may run everything but the one command it is named for.
LACKING = ("fcall", "function", "evalsha", "zrem", "script")


class _LockedProcess(RedisProcess):
    """A server that wants ``PASSWORD``: the fixture's own calls give it."""

    def client(self, **options: Any) -> Any:
        options.setdefault("password", PASSWORD)
        return super().client(**options)


@contextmanager
def locked_redis() -> Iterator[RedisProcess]:
    """A redis-server with ``--requirepass`` and one ACL user ``no-<command>`` per
    command of ``LACKING`` (password ``USER_PASSWORD``), lacking only that command."""
    server = redis_server_binary()
    workdir = Path(tempfile.mkdtemp(prefix="rl-startup-locked-"))

    def command(directory: Path, port: int) -> list[str]:
        return [server, "--port", str(port), "--bind", "127.0.0.1", "--dir", str(directory),
                "--save", "", "--appendonly", "no", "--requirepass", PASSWORD]

    process = _LockedProcess("locked redis", workdir, command)
    try:
        process.start()
        for name in LACKING:
            process.call("ACL", "SETUSER", f"no-{name}", "on", f">{USER_PASSWORD}", "~*",
                         "+@all", f"-{name}")
        yield process
    finally:
        process.kill()
        shutil.rmtree(workdir, ignore_errors=True)


class TLSRedis:
    """A TLS redis-server: ``url`` to reach it (without the CA), ``ca`` to verify it."""

    def __init__(self, process: RedisProcess, tls_port: int, ca: Path) -> None:
        self.process = process
        self.tls_port = tls_port
        self.ca = ca

    @property
    def url(self) -> str:
        return f"rediss://127.0.0.1:{self.tls_port}/0"


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def _certificates(directory: Path) -> None:
    """``ca.crt``, and ``server.crt``/``server.key`` it signs for 127.0.0.1."""
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out",
             "ca.crt", "-days", "2", "-subj", "/CN=ratelimit_mw test CA", cwd=directory)
    _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "server.key", "-out",
             "server.csr", "-subj", "/CN=127.0.0.1", cwd=directory)
    (directory / "san.ext").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n",
                                       encoding="utf-8")
    _openssl("x509", "-req", "-in", "server.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
             "-CAcreateserial", "-out", "server.crt", "-days", "2", "-extfile", "san.ext",
             cwd=directory)


@contextmanager
def tls_redis() -> Iterator[TLSRedis]:
    """A redis-server on TLS (and on a plain port, for the fixture's own checks), with a
    certificate of a CA of its own."""
    server = redis_server_binary()
    if shutil.which("openssl") is None:
        msg = "openssl is not installed"
        raise StartupError(msg)
    workdir = Path(tempfile.mkdtemp(prefix="rl-startup-tls-"))
    _certificates(workdir)
    tls_port = free_port()

    def command(directory: Path, port: int) -> list[str]:
        return [server, "--port", str(port), "--bind", "127.0.0.1", "--dir", str(directory),
                "--save", "", "--appendonly", "no", "--tls-port", str(tls_port),
                "--tls-cert-file", str(workdir / "server.crt"),
                "--tls-key-file", str(workdir / "server.key"),
                "--tls-ca-cert-file", str(workdir / "ca.crt"), "--tls-auth-clients", "no"]

    process = RedisProcess("tls redis", workdir, command)
    try:
        process.start()
        yield TLSRedis(process, tls_port, workdir / "ca.crt")
    finally:
        process.kill()
        shutil.rmtree(workdir, ignore_errors=True)


@asynccontextmanager
async def lifespan(app: ASGIApp, timeout: float = 30.0) -> AsyncIterator[Message]:
    """Run the ASGI lifespan of ``app`` as a server does: yields its answer to the
    start-up (``lifespan.startup.complete`` or ``.failed``); the block is the time it
    serves, and an app that started is shut down after it."""
    inbox: asyncio.Queue[Message] = asyncio.Queue()
    answers: asyncio.Queue[Message] = asyncio.Queue()
    await inbox.put({"type": "lifespan.startup"})
    scope = {"type": "lifespan", "asgi": {"version": "3.0", "spec_version": "2.0"}, "state": {}}
    task = asyncio.create_task(app(scope, inbox.get, answers.put))
    try:
        async with asyncio.timeout(timeout):
            answer = await answers.get()
        yield answer
        if answer["type"] == "lifespan.startup.complete":
            await inbox.put({"type": "lifespan.shutdown"})
            async with asyncio.timeout(timeout):
                await answers.get()
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


def cluster_replica(cluster: ClusterDeployment, of: RedisProcess) -> RedisProcess:
    """Start a node that joins ``cluster`` as a replica of its primary ``of``, and wait
    until it has synced (the caller kills it)."""
    workdir = Path(tempfile.mkdtemp(prefix="rl-startup-replica-"))
    replica = RedisProcess("cluster replica", workdir, cluster_node(redis_server_binary()))
    replica.start()
    replica.call("CLUSTER", "MEET", "127.0.0.1", of.port)
    primary_id = cluster.node_id(of)
    _wait(lambda: primary_id in replica.call("CLUSTER", "NODES"), "the replica to meet")
    replica.call("CLUSTER", "REPLICATE", primary_id)
    _wait(lambda: replica.info("replication").get("master_link_status") == "up",
          "the replica to sync")
    cluster.wait_until_ok()
    return replica


def _wait(condition: Callable[[], bool], what: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            msg = f"timed out after {timeout} s waiting for {what}"
            raise StartupError(msg)
        time.sleep(0.05)

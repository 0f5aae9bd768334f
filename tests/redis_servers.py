"""Throwaway Redis servers on loopback ports, for the tests: a standalone server, a
Cluster and a Sentinel deployment.

A pytest plugin: ``pytest_plugins = ["tests.redis_servers"]`` in the top conftest.
Each deployment starts once per session, on free ports, and is torn down (processes
killed, directories removed) when the session ends, whatever the tests did to it.
Without ``redis-server`` the tests that need one are skipped, or fail when ``$CI``
is set. Tests may kill and restart nodes through the ``RedisProcess`` handles.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import ExitStack, asynccontextmanager, contextmanager, suppress
from pathlib import Path
from typing import Any, Protocol, TypeVar

import pytest
import redis as sync_redis
from redis.crc import key_slot

from ratelimit_mw import Storage, storage_from_url

__all__ = [
    "ClusterDeployment",
    "RedisProcess",
    "SentinelDeployment",
    "StartupError",
    "cluster_node",
    "delayed",
    "own_redis",
    "own_redis_server",
    "own_redis_url",
    "redis_cluster",
    "redis_cluster_url",
    "redis_sentinel",
    "redis_sentinel_url",
    "redis_server_binary",
    "storage_factory",
]

SERVICE = "mymaster"
SLOTS = 16384


class StartupError(RuntimeError):
    """A server of a test deployment did not come up."""


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _wait_for(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while True:
        with suppress(sync_redis.RedisError, OSError, LookupError):  # not yet
            if condition():
                return
        if time.monotonic() > deadline:
            msg = f"timed out after {timeout} s waiting for {what}"
            raise StartupError(msg)
        time.sleep(0.02)


class RedisProcess:
    """One ``redis-server`` (or sentinel) of a deployment, on a loopback port of its own.

    ``command(port)`` gives the command line for a port; the first ``start`` picks a
    free port and tries another if the server cannot bind it. Later starts reuse the
    port, the directory and whatever the server saved there (cluster and sentinel
    state), so a restarted node comes back as itself.
    """

    def __init__(self, name: str, workdir: Path, command: Callable[[Path, int], list[str]]) -> None:
        self.name = name
        self.workdir = workdir
        self._command = command
        self._argv: list[str] | None = None
        self._process: subprocess.Popen[bytes] | None = None
        self.port = 0

    def __repr__(self) -> str:
        state = "running" if self.running else "stopped"
        return f"RedisProcess({self.name!r}, port={self.port}, {state})"

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    @property
    def pid(self) -> int | None:
        """The process id of the running server, None when stopped."""
        process = self._process
        return process.pid if process is not None and process.poll() is None else None

    def client(self, **options: Any) -> sync_redis.Redis:
        """A synchronous client of this one server (close it after use)."""
        options.setdefault("socket_timeout", 2)
        options.setdefault("socket_connect_timeout", 2)
        return sync_redis.Redis(host="127.0.0.1", port=self.port, decode_responses=True, **options)

    def call(self, *args: Any) -> Any:
        """Run one command on this server and return its reply."""
        client = self.client()
        try:
            return client.execute_command(*args)  # type: ignore[no-untyped-call]
        finally:
            client.close()

    def info(self, section: str) -> dict[str, Any]:
        """``INFO section`` as a dict."""
        client = self.client()
        try:
            return dict(client.info(section))
        finally:
            client.close()

    def start(self, timeout: float = 5.0) -> None:
        """Start the server and wait until it answers PING."""
        if self.running:
            return
        attempts = 1 if self._argv is not None else 5
        for _ in range(attempts):
            if self._argv is None or attempts > 1:
                self.port = _free_port()
                self._argv = self._command(self.workdir, self.port)
            self._process = subprocess.Popen(
                self._argv, cwd=self.workdir, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            )
            deadline = time.monotonic() + timeout
            while self._process.poll() is None and time.monotonic() < deadline:
                if self._answers():
                    return
                time.sleep(0.02)
            self.kill()  # exited (the port was taken?) or hung: try a fresh port
        msg = f"{self.name} did not start (last port {self.port}, in {self.workdir})"
        raise StartupError(msg)

    def kill(self) -> None:
        """Kill the server at once (SIGKILL), as a crash would."""
        if self._process is not None:
            if self._process.poll() is None:
                self._process.kill()
            self._process.wait(timeout=10)
            self._process = None

    def _answers(self) -> bool:
        try:
            return bool(self.call("PING"))
        except (sync_redis.RedisError, OSError):
            return False


def redis_server_binary() -> str:
    """The path of redis-server, or StartupError."""
    server = shutil.which("redis-server")
    if server is None:
        msg = "redis-server is not installed"
        raise StartupError(msg)
    return server


def cluster_node(server: str) -> Callable[[Path, int], list[str]]:
    """The command line of a Redis Cluster node (for ``RedisProcess``)."""
    def command(workdir: Path, port: int) -> list[str]:
        return [server, "--port", str(port), "--bind", "127.0.0.1", "--dir", str(workdir),
                "--save", "", "--appendonly", "no", "--cluster-enabled", "yes",
                "--cluster-config-file", f"nodes-{port}.conf", "--cluster-node-timeout", "2000"]
    return command


class ClusterDeployment:
    """Three primaries, no replicas, the 16384 slots split evenly between them."""

    def __init__(self, workdir: Path) -> None:
        server = redis_server_binary()
        self.workdir = workdir
        self.nodes = [
            RedisProcess(f"cluster node {i}", self._dir(f"node{i}"), cluster_node(server))
            for i in range(3)
        ]

    def _dir(self, name: str) -> Path:
        path = self.workdir / name
        path.mkdir()
        return path

    @property
    def url(self) -> str:
        return "redis+cluster://" + ",".join(f"127.0.0.1:{node.port}" for node in self.nodes)

    def start(self) -> None:
        for node in self.nodes:
            node.start()
        # Faster than `redis-cli --cluster create`, which sleeps a second per check.
        count = len(self.nodes)
        for i, node in enumerate(self.nodes):
            node.call("CLUSTER", "ADDSLOTSRANGE", i * SLOTS // count, (i + 1) * SLOTS // count - 1)
        for node in self.nodes[1:]:
            node.call("CLUSTER", "MEET", "127.0.0.1", self.nodes[0].port)
        self.wait_until_ok()

    def wait_until_ok(self, timeout: float = 10.0) -> None:
        """Wait until every running node reports ``cluster_state:ok``."""
        _wait_for(lambda: all("cluster_state:ok" in node.call("CLUSTER", "INFO")
                              for node in self.nodes if node.running),
                  timeout, "cluster_state:ok on every node")

    def stop(self) -> None:
        for node in self.nodes:
            node.kill()

    def node_id(self, node: RedisProcess) -> str:
        return str(node.call("CLUSTER", "MYID"))

    def owner(self, slot: int) -> RedisProcess:
        """The node serving ``slot``, as the first running node sees it."""
        asking = next(node for node in self.nodes if node.running)
        for start, end, (_, port, *_rest), *_replicas in asking.call("CLUSTER", "SLOTS"):
            if start <= slot <= end:
                return next(node for node in self.nodes if node.port == port)
        msg = f"slot {slot} is not served"
        raise LookupError(msg)

    @staticmethod
    def slot(key: str) -> int:
        return key_slot(key.encode())

    def begin_moving(self, slot: int, target: RedisProcess) -> RedisProcess:
        """Mark ``slot`` migrating to ``target`` and move its keys; return the source.

        Until ``finish_moving``, the source answers ASK for keys it no longer holds.
        """
        source = self.owner(slot)
        target.call("CLUSTER", "SETSLOT", slot, "IMPORTING", self.node_id(source))
        source.call("CLUSTER", "SETSLOT", slot, "MIGRATING", self.node_id(target))
        while keys := source.call("CLUSTER", "GETKEYSINSLOT", slot, 100):
            _migrate(source, target, keys)
        return source

    def finish_moving(self, slot: int, target: RedisProcess) -> None:
        """Give ``slot`` to ``target`` on every node: clients now get MOVED."""
        source = self.owner(slot)
        while keys := source.call("CLUSTER", "GETKEYSINSLOT", slot, 100):  # written meanwhile
            _migrate(source, target, keys)
        target_id = self.node_id(target)
        for node in [target, source, *(n for n in self.nodes if n not in (target, source))]:
            node.call("CLUSTER", "SETSLOT", slot, "NODE", target_id)

    def move_slot(self, slot: int, target: RedisProcess) -> None:
        """Reshard one slot to ``target``, keys and all."""
        self.begin_moving(slot, target)
        self.finish_moving(slot, target)


def _migrate(source: RedisProcess, target: RedisProcess, keys: list[str]) -> None:
    """Move ``keys`` from ``source`` to ``target``, replacing what the target holds of
    them: a MIGRATE cut off on a loaded host (its own timeout, or the client's, which
    sends it again) leaves on the source the keys whose RESTORE it saw no answer to, and
    the next MIGRATE of them then fails with BUSYKEY. The source's copy is the live one:
    no client writes a key to the target while the source still holds it."""
    source.call("MIGRATE", "127.0.0.1", target.port, "", 0, 5000, "REPLACE", "KEYS", *keys)


def _sentinel(server: str, primary: RedisProcess) -> Callable[[Path, int], list[str]]:
    def command(workdir: Path, port: int) -> list[str]:
        config = workdir / "sentinel.conf"  # Sentinel rewrites it with what it learns
        config.write_text(
            f"port {port}\nbind 127.0.0.1\ndir {workdir}\n"
            f"sentinel monitor {SERVICE} 127.0.0.1 {primary.port} 2\n"
            f"sentinel down-after-milliseconds {SERVICE} 1000\n"
            f"sentinel failover-timeout {SERVICE} 3000\n",
            encoding="utf-8",
        )
        return [server, str(config), "--sentinel"]
    return command


def _data_node(server: str, primary: RedisProcess | None) -> Callable[[Path, int], list[str]]:
    def command(workdir: Path, port: int) -> list[str]:
        argv = [server, "--port", str(port), "--bind", "127.0.0.1", "--dir", str(workdir),
                "--save", "", "--appendonly", "no", "--repl-diskless-sync-delay", "0"]
        if primary is not None:
            argv += ["--replicaof", "127.0.0.1", str(primary.port)]
        return argv
    return command


class SentinelDeployment:
    """A primary, one replica and three sentinels (quorum 2) watching ``mymaster``."""

    def __init__(self, workdir: Path) -> None:
        server = redis_server_binary()
        self.workdir = workdir
        for name in ("primary", "replica", "sentinel0", "sentinel1", "sentinel2"):
            (workdir / name).mkdir()
        self.primary = RedisProcess("primary", workdir / "primary", _data_node(server, None))
        self.replica = RedisProcess(
            "replica", workdir / "replica", _data_node(server, self.primary))
        self.sentinels = [
            RedisProcess(f"sentinel {i}", workdir / f"sentinel{i}", _sentinel(server, self.primary))
            for i in range(3)
        ]

    @property
    def data_nodes(self) -> list[RedisProcess]:
        return [self.primary, self.replica]

    @property
    def url(self) -> str:
        hosts = ",".join(f"127.0.0.1:{sentinel.port}" for sentinel in self.sentinels)
        return f"redis+sentinel://{hosts}/{SERVICE}"

    def start(self) -> None:
        for process in (self.primary, self.replica, *self.sentinels):
            process.start()
        _wait_for(lambda: all(self._master_port(s) == self.primary.port for s in self.sentinels),
                  5, "every sentinel to name the primary")

    def stop(self) -> None:
        for process in (*self.sentinels, self.replica, self.primary):
            process.kill()

    def _master_port(self, sentinel: RedisProcess) -> int:
        host_port = sentinel.call("SENTINEL", "GET-MASTER-ADDR-BY-NAME", SERVICE)
        return int(host_port[1])

    def current_primary(self) -> RedisProcess:
        """The data node that the running sentinels agree is the primary."""
        ports = {self._master_port(s) for s in self.sentinels if s.running}
        if len(ports) != 1:
            msg = f"the sentinels disagree on the primary: ports {sorted(ports)}"
            raise LookupError(msg)
        return next(node for node in self.data_nodes if node.port in ports)

    def wait_until_ready(self, timeout: float = 10.0) -> None:
        """Wait until a failover can happen: sentinels know each other and a synced replica."""
        def ready() -> bool:
            primary = self.current_primary()
            replicas = [node for node in self.data_nodes if node is not primary and node.running]
            for sentinel in self.sentinels:
                state = _pairs(sentinel.call("SENTINEL", "MASTER", SERVICE))
                if int(state["num-other-sentinels"]) < 2 or int(state["num-slaves"]) < 1:
                    return False
            return any(node.info("replication").get("master_link_status") == "up"
                       for node in replicas)
        _wait_for(ready, timeout, "sentinels that know each other and a synced replica")

    def wait_for_failover(self, old: RedisProcess, timeout: float = 15.0) -> RedisProcess:
        """Wait until the sentinels have promoted another node than ``old``; return it."""
        def promoted() -> bool:
            primary = self.current_primary()
            return primary is not old and primary.info("replication")["role"] == "master"
        _wait_for(promoted, timeout, f"a failover away from port {old.port}")
        return self.current_primary()


@contextmanager
def own_redis(name: str = "redis") -> Iterator[RedisProcess]:
    """A standalone redis-server of our own (no persistence) on a free loopback port, to
    kill and restart at will; killed and its folder removed on exit."""
    workdir = Path(tempfile.mkdtemp(prefix="ratelimit-redis-"))
    process = None
    try:
        process = RedisProcess(name, workdir, _data_node(redis_server_binary(), None))
        process.start()
        yield process
    finally:
        if process is not None:
            process.kill()
        shutil.rmtree(workdir, ignore_errors=True)


def _pairs(flat: Any) -> dict[str, str]:
    if isinstance(flat, dict):
        return {str(k): str(v) for k, v in flat.items()}
    return {str(flat[i]): str(flat[i + 1]) for i in range(0, len(flat), 2)}


def _unavailable(reason: str) -> None:
    if os.environ.get("CI"):
        pytest.fail(reason)
    pytest.skip(reason)


class _Deployment(Protocol):
    def start(self) -> None: ...
    def stop(self) -> None: ...


DeploymentT = TypeVar("DeploymentT", bound=_Deployment)


@contextmanager
def _deployed(make: Callable[[Path], DeploymentT], prefix: str, what: str,
              ) -> Iterator[DeploymentT]:
    """Start a deployment in a temporary folder; stop it and remove the folder after."""
    workdir = Path(tempfile.mkdtemp(prefix=prefix))
    deployment = None
    try:
        try:
            deployment = make(workdir)
            deployment.start()
        except (StartupError, sync_redis.RedisError, OSError) as exc:
            _unavailable(f"couldn't start {what}: {exc}")
        yield deployment  # type: ignore[misc]
    finally:
        if deployment is not None:
            deployment.stop()
        shutil.rmtree(workdir, ignore_errors=True)


@pytest.fixture(scope="session")
def own_redis_server() -> Iterator[RedisProcess]:
    """A standalone redis-server this session started, for the whole session: the only
    kind of server a test may SCRIPT FLUSH, FLUSHDB or reconfigure."""
    with ExitStack() as stack:
        try:
            process = stack.enter_context(own_redis("the session's redis"))
        except StartupError as exc:
            _unavailable(f"couldn't start a redis-server: {exc}")
        yield process


@pytest.fixture(scope="session")
def own_redis_url(own_redis_server: RedisProcess) -> str:
    """``redis://127.0.0.1:PORT/0`` of ``own_redis_server``."""
    return f"redis://127.0.0.1:{own_redis_server.port}/0"


@pytest.fixture(scope="session")
def redis_cluster() -> Iterator[ClusterDeployment]:
    """A three-primary Redis Cluster of throwaway servers, for the whole session."""
    with _deployed(ClusterDeployment, "ratelimit-cluster-", "a Redis Cluster") as deployment:
        yield deployment


@pytest.fixture(scope="session")
def redis_cluster_url(redis_cluster: ClusterDeployment) -> str:
    """``redis+cluster://127.0.0.1:P1,127.0.0.1:P2,127.0.0.1:P3``."""
    return redis_cluster.url


@pytest.fixture(scope="session")
def redis_sentinel() -> Iterator[SentinelDeployment]:
    """A primary, a replica and three sentinels of throwaway servers, for the whole session."""
    with _deployed(SentinelDeployment, "ratelimit-sentinel-", "Redis Sentinel") as deployment:
        yield deployment


@pytest.fixture(scope="session")
def redis_sentinel_url(redis_sentinel: SentinelDeployment) -> str:
    """``redis+sentinel://127.0.0.1:S1,127.0.0.1:S2,127.0.0.1:S3/mymaster``."""
    return redis_sentinel.url


StorageFactory = Callable[..., Storage]


@asynccontextmanager
async def storage_factory(url: str) -> AsyncIterator[StorageFactory]:
    """``make_storage(clock=None, **options)`` on ``url``, with a key prefix of its own.

    Every storage made is closed on exit. The deployments are throwaway, so their
    keys are left to expire.
    """
    prefix = f"rltest:{uuid.uuid4().hex[:12]}:"
    made: list[Storage] = []

    def factory(clock: Callable[[], float] | None = None, **options: Any) -> Storage:
        storage = storage_from_url(url, prefix=prefix, **options)
        storage._clock = clock  # type: ignore[attr-defined]  # see tests.conftest.on_clock
        made.append(storage)
        return storage

    try:
        yield factory
    finally:
        for storage in made:
            await storage.close()


@asynccontextmanager
async def delayed(redis_url: str, delay: float) -> AsyncIterator[str]:
    """A proxy to ``redis_url`` that holds every chunk ``delay`` seconds each way."""
    upstream = redis_url.split("//", 1)[1].split("/", 1)[0]
    host, _, port = upstream.rpartition(":")

    async def pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        loop = asyncio.get_running_loop()
        with suppress(OSError):
            while data := await reader.read(65536):
                loop.call_later(delay, writer.write, data)
        await asyncio.sleep(delay)
        writer.close()

    writers: list[asyncio.StreamWriter] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection(host, int(port))
        writers.extend((writer, up_writer))
        await asyncio.gather(pump(reader, up_writer), pump(up_reader, writer))

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    try:
        yield f"redis://127.0.0.1:{server.sockets[0].getsockname()[1]}/0"
    finally:
        server.close()
        for writer in writers:
            writer.close()
        for writer in writers:
            with suppress(OSError):
                await writer.wait_closed()
        await asyncio.sleep(2 * delay)  # the pumps' last delayed writes

"""The Redis deployments the chaos soak runs on, and the faults each can suffer.

- ``single``: one redis-server, reached through the fault proxy (``tests/faults_proxy``):
  killed and restarted, frozen (SIGSTOP), slowed (``DEBUG SLEEP``), 500 ms of latency
  on the link, a link that holds, a connection reset in the middle of a reply;
- ``cluster``: three primaries with a replica each: a ``CLUSTER FAILOVER`` (the replica
  takes over, the primary steps down), a primary killed (its replica is elected) and
  restarted (it comes back as a replica);
- ``sentinel``: a primary, a replica and three sentinels: ``SENTINEL FAILOVER``, a
  primary killed (promoted away from) and restarted.

A fault "forgets" when counters written just before it may be lost (a restart without
persistence, a replica promoted before it had every write): the soak's bound on
admitted requests allows one burst more per such fault.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import redis as sync_redis

from tests.faults_proxy import ProxyProcess, fault_proxy
from tests.redis_servers import (
    SERVICE,
    ClusterDeployment,
    RedisProcess,
    SentinelDeployment,
    cluster_node,
    own_redis,
    redis_server_binary,
)

__all__ = ["DEPLOYMENTS", "Deployment", "deployed"]

DEPLOYMENTS = ("single", "cluster", "sentinel")


class Deployment:
    """A running deployment: the URL the app uses, its faults, its primaries."""

    url = ""
    faults: tuple[tuple[str, float], ...] = ()
    """(kind, seconds) of each fault it can suffer, in the order the soak makes them."""
    forgetting: frozenset[str] = frozenset()
    """The kinds of fault that may lose counters."""

    def fault(self, kind: str, seconds: float) -> None:
        raise NotImplementedError

    def primaries(self) -> list[RedisProcess]:
        raise NotImplementedError


class Single(Deployment):
    faults = (("kill", 2.0), ("freeze", 3.0), ("slow", 0.5), ("latency", 3.0),
              ("hold", 3.0), ("reset", 0.0))
    forgetting = frozenset({"kill"})

    def __init__(self, redis: RedisProcess, proxy: ProxyProcess) -> None:
        self.redis = redis
        self.proxy = proxy
        self.url = proxy.url

    def fault(self, kind: str, seconds: float) -> None:
        redis, proxy = self.redis, self.proxy
        if kind == "kill":
            redis.kill()
            time.sleep(seconds)
            redis.start()
        elif kind == "freeze":
            pid = int(redis.info("server")["process_id"])
            os.kill(pid, signal.SIGSTOP)
            try:
                time.sleep(seconds)
            finally:
                os.kill(pid, signal.SIGCONT)
        elif kind == "slow":
            with contextlib.suppress(sync_redis.RedisError):
                redis.client(socket_timeout=seconds + 5).execute_command(
                    "DEBUG", "SLEEP", seconds)
        elif kind in ("latency", "hold"):
            if kind == "latency":
                proxy.latency = 0.5
            else:
                proxy.hold()
            try:
                time.sleep(seconds)
            finally:
                proxy.clear()
        else:
            proxy.reset_mid_reply()

    def primaries(self) -> list[RedisProcess]:
        return [self.redis]


class ReplicatedCluster(ClusterDeployment):
    """Three primaries, each with a replica; a node fails over in about 2 s."""

    def __init__(self, workdir: Path) -> None:
        super().__init__(workdir)
        server = redis_server_binary()
        self.replicas = [RedisProcess(f"cluster replica {i}", self._dir(f"replica{i}"),
                                      cluster_node(server)) for i in range(3)]

    def start(self) -> None:
        super().start()
        for replica in self.replicas:
            replica.start()
            replica.call("CLUSTER", "MEET", "127.0.0.1", self.nodes[0].port)
        for replica, primary in zip(self.replicas, self.nodes, strict=True):
            primary_id = self.node_id(primary)
            _wait(lambda r=replica, p=primary_id: p in r.call("CLUSTER", "NODES"), 10,
                  "the replica to learn its primary")
            replica.call("CLUSTER", "REPLICATE", primary_id)
        self.wait_until_synced()

    def stop(self) -> None:
        for replica in self.replicas:
            replica.kill()
        super().stop()

    @property
    def all_nodes(self) -> list[RedisProcess]:
        return [*self.nodes, *self.replicas]

    def primaries(self) -> list[RedisProcess]:
        return [node for node in self.all_nodes
                if node.running and node.info("replication")["role"] == "master"]

    def wait_until_synced(self, timeout: float = 20.0) -> None:
        """Every slot served, and every primary with a replica in sync."""
        def synced() -> bool:
            running = [node for node in self.all_nodes if node.running]
            if not all("cluster_state:ok" in node.call("CLUSTER", "INFO") for node in running):
                return False
            replicas = [node for node in running
                        if node.info("replication")["role"] == "slave"]
            return len(replicas) == 3 and all(
                node.info("replication").get("master_link_status") == "up"
                for node in replicas)
        _wait(synced, timeout, "a cluster with every replica in sync")

    def replica_of_first_shard(self) -> RedisProcess:
        """The replica of the primary that serves slot 0."""
        primary = next(node for node in self.primaries()
                       if _serves(node, 0))
        primary_id = self.node_id(primary)
        return next(node for node in self.all_nodes if node.running and node is not primary
                    and node.info("replication")["role"] == "slave"
                    and primary_id in _line_of(node, "myself"))


def _line_of(node: RedisProcess, flag: str) -> str:
    """The ``CLUSTER NODES`` line of ``node`` flagged ``flag`` (myself)."""
    return next(line for line in str(node.call("CLUSTER", "NODES")).splitlines()
                if flag in line.split()[2])


def _serves(node: RedisProcess, slot: int) -> bool:
    for start, end, (_, port, *_rest), *_replicas in node.call("CLUSTER", "SLOTS"):
        if start <= slot <= end and port == node.port:
            return True
    return False


class Cluster(Deployment):
    faults = (("cluster-failover", 0.0), ("kill-primary", 0.0))
    forgetting = frozenset({"kill-primary"})

    def __init__(self, cluster: ReplicatedCluster) -> None:
        self.cluster = cluster
        self.url = cluster.url

    def fault(self, kind: str, seconds: float) -> None:
        cluster = self.cluster
        replica = cluster.replica_of_first_shard()
        if kind == "cluster-failover":
            replica.call("CLUSTER", "FAILOVER")
        else:
            primary = next(node for node in cluster.primaries() if _serves(node, 0))
            primary.kill()
            _wait(lambda: replica.info("replication")["role"] == "master", 20,
                  "the replica's election")
            primary.start()  # back as a replica of the one elected
        cluster.wait_until_synced()

    def primaries(self) -> list[RedisProcess]:
        return self.cluster.primaries()


class Sentinel(Deployment):
    faults = (("sentinel-failover", 0.0), ("kill-primary", 0.0))
    forgetting = frozenset({"sentinel-failover", "kill-primary"})

    def __init__(self, deployment: SentinelDeployment) -> None:
        self.deployment = deployment
        self.url = deployment.url

    def fault(self, kind: str, seconds: float) -> None:
        deployment = self.deployment
        deployment.wait_until_ready()
        old = deployment.current_primary()
        if kind == "sentinel-failover":
            # Refused (NOGOODSLAVE) until the sentinels have seen the replica in sync
            # for a moment, as after the previous failover.
            _wait(lambda: deployment.sentinels[0].call("SENTINEL", "FAILOVER", SERVICE), 20,
                  "a sentinel to accept the failover")
            deployment.wait_for_failover(old)
        else:
            old.kill()
            deployment.wait_for_failover(old)
            old.start()  # the sentinels make it a replica of the new primary
        deployment.wait_until_ready(20)

    def primaries(self) -> list[RedisProcess]:
        return [self.deployment.current_primary()]


def _wait(condition: object, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while True:
        with contextlib.suppress(sync_redis.RedisError, OSError, LookupError, StopIteration):
            if condition():  # type: ignore[operator]
                return
        if time.monotonic() > deadline:
            msg = f"timed out after {timeout} s waiting for {what}"
            raise TimeoutError(msg)
        time.sleep(0.05)


@contextlib.contextmanager
def deployed(name: str) -> Iterator[Deployment]:
    """The deployment ``name`` (one of ``DEPLOYMENTS``), torn down on exit."""
    if name == "single":
        with own_redis() as redis, fault_proxy("127.0.0.1", redis.port) as proxy:
            yield Single(redis, proxy)
        return
    workdir = Path(tempfile.mkdtemp(prefix=f"ratelimit-chaos-{name}-"))
    made: ReplicatedCluster | SentinelDeployment | None = None
    try:
        if name == "cluster":
            made = ReplicatedCluster(workdir)
            made.start()
            yield Cluster(made)
        elif name == "sentinel":
            made = SentinelDeployment(workdir)
            made.start()
            made.wait_until_ready()
            yield Sentinel(made)
        else:
            msg = f"unknown deployment {name!r}; expected one of {', '.join(DEPLOYMENTS)}"
            raise ValueError(msg)
    finally:
        if made is not None:
            made.stop()
        shutil.rmtree(workdir, ignore_errors=True)

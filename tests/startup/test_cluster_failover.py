"""A Cluster primary failed over to its replica during traffic lets nothing through:
steady traffic from one client at 3 times its limit, the primary holding its counters
replaced by its replica (``CLUSTER FAILOVER``) meanwhile: exactly the limit admitted."""

from __future__ import annotations

import asyncio
import shutil
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.redis_servers import ClusterDeployment, RedisProcess
from tests.reliability.servers import RawHTTP, Reply, uvicorn_server
from tests.startup.servers import cluster_replica

pytestmark = [pytest.mark.reliability, pytest.mark.redis, pytest.mark.slow]

LIMIT = 30
PAUSE = 0.1  # 10 requests a second


@pytest.fixture
def own_cluster(tmp_path: Path) -> Iterator[ClusterDeployment]:
    """A cluster of this test's own: its topology changes."""
    cluster = ClusterDeployment(tmp_path)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


def _holder(cluster: ClusterDeployment, prefix: str) -> RedisProcess:
    """The primary that holds the keys under ``prefix`` (one client's: one slot)."""
    return next(node for node in cluster.nodes if node.call("KEYS", f"{prefix}*"))


async def _promoted(replica: RedisProcess, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while replica.info("replication")["role"] != "master":
        assert time.monotonic() < deadline, "the replica was not promoted"
        await asyncio.sleep(0.05)


async def test_a_primary_failover_during_traffic_admits_no_more_than_the_limit(
    own_cluster: ClusterDeployment,
) -> None:
    """10 requests a second against 30 an hour (90 in all); the counters' primary fails
    over to its replica after 2 s: 30 admitted, every one by the cluster."""
    prefix = f"rlfail:{uuid.uuid4().hex[:12]}:"
    env = {"RATELIMIT_STORAGE_URL": own_cluster.url, "RATELIMIT_STORAGE_PREFIX": prefix,
           "RATELIMIT_STORAGE_TIMEOUT": "0.1",  # as in test_first_burst: a loaded host
           "RL_APP_LIMIT": str(LIMIT), "RL_APP_PERIOD": "hour"}
    replies: list[Reply] = []
    with uvicorn_server(env, workers=2) as base:
        first = httpx.get(f"{base}/alg/sliding_window", headers={"connection": "close"})
        assert first.status_code == 200
        replica = cluster_replica(own_cluster, _holder(own_cluster, prefix))
        try:
            stop = asyncio.Event()
            traffic = asyncio.create_task(RawHTTP(base, connections=1).until(
                stop, ("/alg/sliding_window", {"connection": "close"}), replies,
                limit_s=600, pause=PAUSE))
            await asyncio.sleep(2.0)
            replica.call("CLUSTER", "FAILOVER")
            await _promoted(replica)
            await asyncio.sleep(2.0)
            while len(replies) < 3 * LIMIT:  # 3 times the limit in all
                await asyncio.sleep(PAUSE)
            stop.set()
            await traffic
        finally:
            replica.kill()
            shutil.rmtree(replica.workdir, ignore_errors=True)
    answered = [reply for reply in replies if reply.status]
    assert len(answered) >= 2 * LIMIT, f"only {len(answered)} of {len(replies)} answered"
    admitted = [reply for reply in answered if reply.status == 200]
    assert len(admitted) == LIMIT - 1  # and the first request
    assert {reply.headers["x-rl-source"] for reply in admitted} == {"storage"}
    assert {reply.status for reply in answered} == {200, 429}

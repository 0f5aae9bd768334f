"""Cluster and Sentinel URLs: what they build, and refusals that name the URL (no server)."""

from __future__ import annotations

import pytest
from redis.asyncio.cluster import RedisCluster
from redis.asyncio.connection import SSLConnection

from ratelimit_mw import ConfigError, RedisStorage, storage_from_url
from ratelimit_mw.storage.cluster import cluster_client_from_url
from ratelimit_mw.storage.sentinel import sentinel_client_from_url


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        ("redis+cluster://", "needs a host"),
        ("redis+cluster://:7000", "needs a host"),
        ("redis+cluster://a:7000,", "needs a host"),
        ("redis+cluster://a:99999", "bad port"),
        ("redis+cluster://a:7x", "bad port"),
        ("redis+cluster://::1:7000", "brackets"),
        ("redis+cluster://[::1]x", "bad address"),
        ("redis+cluster://a:7000/1", "only database 0"),
        ("redis+cluster://a:7000?bogus=1", "unknown option 'bogus'"),
        ("redis+cluster://a:7000?socket_timeout=-1", "positive number of seconds"),
        ("redis+cluster://a:7000?socket_timeout=soon", "socket_timeout"),
        ("redis+cluster://a:7000?max_connections=0", "positive integer"),
        ("redis+cluster://a:7000?password=x&password=y", "given twice"),
        ("redis+cluster://a:7000?ssl_certfile=c.pem", "unknown option 'ssl_certfile'"),
        ("rediss+cluster://a:7000?ssl_check_hostname=maybe", "true or false"),
        ("redis+sentinel://a:26379", "name the service"),
        ("redis+sentinel://a:26379/", "name the service"),
        ("redis+sentinel://a:26379/svc/zero", "must be a number"),
        ("redis+sentinel://a:26379/svc?db=1", "unknown option 'db'"),
    ],
)
def test_bad_urls_are_refused_naming_the_url(url: str, reason: str) -> None:
    """A malformed Cluster or Sentinel URL is a ConfigError saying which and why."""
    with pytest.raises(ConfigError, match="storage URL") as caught:
        storage_from_url(url)
    message = str(caught.value)
    assert reason in message
    assert url.split("?")[0] in message


def test_passwords_are_hidden_in_errors() -> None:
    """Credentials in the URL or its query never reach the error message."""
    url = "redis+sentinel://app:s3cret@a/svc?sentinel_password=hunter2&bogus=1"
    with pytest.raises(ConfigError, match="unknown option 'bogus'") as caught:
        storage_from_url(url)
    message = str(caught.value)
    assert "s3cret" not in message and "hunter2" not in message
    assert "app:***@a/svc?sentinel_password=***&bogus=1" in message


@pytest.mark.parametrize("option", [{"no_such_option": 1}, {"db": 3}])
def test_bad_keyword_options_are_refused(option: dict[str, object]) -> None:
    """Options redis-py would reject are refused when the storage is built, not per request."""
    with pytest.raises(ConfigError, match="storage URL"):
        storage_from_url("redis+cluster://a:7000", **option)


def test_bad_keyword_options_are_refused_for_sentinel() -> None:
    """Sentinel's connections are made lazily; their options are still checked at once."""
    with pytest.raises(ConfigError, match="no_such_option"):
        storage_from_url("redis+sentinel://a:26379/svc", no_such_option=1)


async def test_cluster_url_names_the_startup_nodes() -> None:
    """Every host:port is a startup node; credentials and options reach the connections."""
    client = cluster_client_from_url(
        "redis+cluster://app:pw@10.0.0.1:7000,[::1]:7001,cache.internal"
        "?socket_timeout=0.5&max_connections=7&client_name=rl",
    )
    try:
        assert isinstance(client, RedisCluster)
        nodes = client.nodes_manager.startup_nodes.values()
        assert [(node.host, int(node.port)) for node in nodes] == [
            ("10.0.0.1", 7000), ("::1", 7001), ("cache.internal", 6379)]
        kwargs = client.connection_kwargs
        assert (kwargs["username"], kwargs["password"], kwargs["socket_timeout"]) == \
            ("app", "pw", 0.5)
        assert (kwargs["max_connections"], kwargs["client_name"]) == (7, "rl")
        assert client.retry.get_retries() == 3
    finally:
        await client.aclose()


async def test_rediss_cluster_uses_tls() -> None:
    """rediss+cluster:// connects with TLS and takes the TLS options."""
    client = cluster_client_from_url(
        "rediss+cluster://a:7000?ssl_cert_reqs=none&ssl_check_hostname=false", timeout=2)
    try:
        kwargs = client.connection_kwargs
        assert issubclass(kwargs["connection_class"], SSLConnection)
        assert (kwargs["ssl_cert_reqs"], kwargs["ssl_check_hostname"]) == ("none", False)
        assert kwargs["socket_timeout"] == kwargs["socket_connect_timeout"] == 2
    finally:
        await client.aclose()


async def test_sentinel_url_names_sentinels_service_and_db() -> None:
    """The hosts are sentinels; the path names the service and the database."""
    client = sentinel_client_from_url(
        "redis+sentinel://:primary-pw@s1:26380,s2/cache/2"
        "?sentinel_password=sentinel-pw&socket_timeout=0.25",
    )
    try:
        pool = client.connection_pool
        assert pool.service_name == "cache"  # type: ignore[attr-defined]
        assert (pool.connection_kwargs["db"], pool.connection_kwargs["password"]) == \
            (2, "primary-pw")
        sentinels = pool.sentinel_manager.sentinels  # type: ignore[attr-defined]
        addresses = [(s.connection_pool.connection_kwargs["host"],
                      s.connection_pool.connection_kwargs["port"]) for s in sentinels]
        assert addresses == [("s1", 26380), ("s2", 26379)]
        sentinel_kwargs = sentinels[0].connection_pool.connection_kwargs
        assert sentinel_kwargs["password"] == "sentinel-pw"
        assert sentinel_kwargs["socket_timeout"] == 0.25
    finally:
        await client.aclose()


@pytest.mark.parametrize(
    "url", ["redis+cluster://a:7000", "REDISS+CLUSTER://a:7000", "redis+sentinel://a/svc"])
async def test_storage_from_url_knows_both_schemes(url: str) -> None:
    """storage_from_url builds a RedisStorage, with its prefix, for each new scheme."""
    storage = storage_from_url(url, prefix="app:")
    try:
        assert isinstance(storage, RedisStorage)
        assert storage.prefix == "app:"
    finally:
        await storage.close()

"""rediss:// reaches a real TLS Redis started for the test."""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from ratelimit_mw import Hit, Limit, RedisStorage, storage_from_url
from tests.conftest import free_port


@pytest.fixture(scope="module")
def tls_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[int, Path]]:
    """A redis-server speaking only TLS, with a self-signed certificate."""
    server, openssl = shutil.which("redis-server"), shutil.which("openssl")
    if server is None or openssl is None:
        pytest.fail("redis-server and openssl are needed for the TLS test")
    folder = tmp_path_factory.mktemp("tls")
    cert, key = folder / "cert.pem", folder / "key.pem"
    subprocess.run(
        [openssl, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key),
         "-out", str(cert), "-days", "1", "-subj", "/CN=127.0.0.1",
         "-addext", "subjectAltName=IP:127.0.0.1"],
        check=True, capture_output=True,
    )
    port = free_port()
    proc = subprocess.Popen(
        [server, "--port", "0", "--tls-port", str(port), "--bind", "127.0.0.1",
         "--tls-cert-file", str(cert), "--tls-key-file", str(key),
         "--tls-ca-cert-file", str(cert), "--tls-auth-clients", "no",
         "--save", "", "--appendonly", "no", "--dir", str(folder)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 10
        while subprocess.run(
            ["redis-cli", "--tls", "--cacert", str(cert), "-p", str(port), "ping"],
            capture_output=True, text=True,
        ).stdout.strip() != "PONG":
            if time.monotonic() > deadline or proc.poll() is not None:
                pytest.fail("the TLS redis-server did not start")
            time.sleep(0.05)
        yield port, cert
    finally:
        proc.terminate()
        proc.wait(timeout=10)


async def test_rediss_url_decides_over_tls(tls_redis: tuple[int, Path]) -> None:
    """A rediss:// storage verifies the server's certificate and decides as usual."""
    port, cert = tls_redis
    storage = storage_from_url(f"rediss://127.0.0.1:{port}/0?ssl_ca_certs={cert}")
    try:
        assert isinstance(storage, RedisStorage)
        hit = Hit(Limit("1/minute"))
        assert (await storage.decide("tls", [hit])).allowed
        assert not (await storage.decide("tls", [hit])).allowed
    finally:
        await storage.close()


async def test_plain_redis_url_cannot_talk_to_a_tls_port(tls_redis: tuple[int, Path]) -> None:
    """redis:// against a TLS-only port fails as a StorageError, not a hang or a crash."""
    from ratelimit_mw import StorageError

    port, _ = tls_redis
    storage = storage_from_url(f"redis://127.0.0.1:{port}/0", timeout=0.5)
    try:
        with pytest.raises(StorageError):
            await storage.decide("tls", [Hit(Limit("1/minute"))])
    finally:
        await storage.close()

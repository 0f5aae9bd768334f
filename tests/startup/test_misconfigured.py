"""A storage set up wrong refuses the start-up with one line; one merely unreachable or
slow starts, says so once, and the failure policy answers."""

from __future__ import annotations

import logging
from collections.abc import Callable

import httpx
import pytest

from ratelimit_mw.events import DecisionEvent
from tests.conftest import free_port
from tests.redis_servers import RedisProcess, StartupError, delayed
from tests.reliability.servers import uvicorn_server
from tests.startup.conftest import AppFactory
from tests.startup.servers import LACKING, PASSWORD, USER_PASSWORD, TLSRedis, lifespan

pytestmark = pytest.mark.redis

UrlOf = Callable[[RedisProcess, TLSRedis], str]


def _port(process: RedisProcess) -> str:
    return f"127.0.0.1:{process.port}"


MISCONFIGURED: dict[str, tuple[UrlOf, str]] = {
    "wrong password": (lambda r, t: f"redis://:wrong-pw@{_port(r)}/0", "authentication"),
    "no password": (lambda r, t: f"redis://{_port(r)}/0", "authentication"),
    "unknown user": (lambda r, t: f"redis://nobody:{USER_PASSWORD}@{_port(r)}/0",
                     "authentication"),
    **{f"user without {name}": (
        lambda r, t, name=name: f"redis://no-{name}:{USER_PASSWORD}@{_port(r)}/0",
        "NOPERM") for name in LACKING},
    "database out of range": (lambda r, t: f"redis://:{PASSWORD}@{_port(r)}/99",
                              "database index"),
    "unresolvable host": (lambda r, t: "redis://no-such-host.invalid:6379/0",
                          "does not resolve"),
    "TLS certificate not verified": (lambda r, t: t.url, "certificate failed verification"),
}


@pytest.mark.parametrize("case", MISCONFIGURED)
async def test_a_misconfigured_storage_refuses_the_start_up(
    case: str, locked: RedisProcess, tls: TLSRedis, app_on: AppFactory,
) -> None:
    """Start-up fails with one line naming the storage (password hidden) and the cause."""
    url_of, cause = MISCONFIGURED[case]
    url = url_of(locked, tls)
    async with lifespan(app_on(url)) as answer:
        assert answer["type"] == "lifespan.startup.failed"
    line = answer["message"]
    assert "\n" not in line
    assert line.startswith("ratelimit_mw: storage ")
    assert "misconfigured" in line
    assert cause in line
    host = url.split("@")[-1].split("://")[-1].split("/")[0]
    assert host in line
    assert PASSWORD not in line
    assert USER_PASSWORD not in line
    assert "wrong-pw" not in line


@pytest.mark.parametrize("name", LACKING)
async def test_the_missing_permission_is_named(
    name: str, locked: RedisProcess, app_on: AppFactory,
) -> None:
    """A user lacking one command the library runs is told which one."""
    url = f"redis://no-{name}:{USER_PASSWORD}@{_port(locked)}/0"
    async with lifespan(app_on(url)) as answer:
        assert answer["type"] == "lifespan.startup.failed"
    assert f"'{name}" in answer["message"].lower()


async def _get(app: object, events: list[DecisionEvent]) -> tuple[int, str]:
    """One request through ``app``: its status and where its decision came from."""
    transport = httpx.ASGITransport(app=app)  # type: ignore[arg-type]
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        status = (await client.get("/")).status_code
    return status, events[-1].source


@pytest.mark.parametrize("setup", ["password", "TLS with its CA"])
async def test_a_storage_set_up_right_starts_and_decides(
    setup: str, locked: RedisProcess, tls: TLSRedis, app_on: AppFactory,
    events: list[DecisionEvent], caplog: pytest.LogCaptureFixture,
) -> None:
    """With the password or the CA, start-up completes quietly and Redis decides the
    first request."""
    url = (f"redis://:{PASSWORD}@{_port(locked)}/0" if setup == "password"
           else f"{tls.url}?ssl_ca_certs={tls.ca}")
    caplog.set_level(logging.WARNING, logger="ratelimit_mw")
    app = app_on(url)
    async with lifespan(app) as answer:
        assert answer["type"] == "lifespan.startup.complete"
        assert await _get(app, events) == (200, "storage")
    assert not caplog.records


async def test_an_unreachable_storage_starts_warns_once_and_fails_open(
    app_on: AppFactory, events: list[DecisionEvent], caplog: pytest.LogCaptureFixture,
) -> None:
    """Connection refused is a runtime condition: the server starts with one warning
    naming the storage, and the failure policy (open) answers."""
    url = f"redis://:{PASSWORD}@127.0.0.1:{free_port()}/0"
    caplog.set_level(logging.WARNING, logger="ratelimit_mw")
    app = app_on(url)
    async with lifespan(app) as answer:
        assert answer["type"] == "lifespan.startup.complete"
        starting = [r.getMessage() for r in caplog.records]
        assert len(starting) == 1
        assert "not reachable" in starting[0]
        assert url.replace(PASSWORD, "***") in starting[0]
        assert PASSWORD not in starting[0]
        assert await _get(app, events) == (200, "unavailable")


async def test_an_unreachable_storage_refuses_the_start_up_when_required(
    app_on: AppFactory,
) -> None:
    """``require_storage``: no storage, no start."""
    app = app_on(f"redis://127.0.0.1:{free_port()}/0", require_storage=True)
    async with lifespan(app) as answer:
        assert answer["type"] == "lifespan.startup.failed"
    assert "not reachable" in answer["message"]
    assert "require_storage" in answer["message"]


async def test_a_storage_not_ready_in_time_starts_with_one_line(
    redis_url: str, app_on: AppFactory, caplog: pytest.LogCaptureFixture,
) -> None:
    """A storage slower than ``startup_timeout``: the server starts and says why once
    (or refuses, with ``require_storage``)."""
    caplog.set_level(logging.WARNING, logger="ratelimit_mw")
    async with delayed(redis_url, 0.3) as slow_url:
        async with lifespan(app_on(slow_url, startup_timeout=0.2)) as answer:
            assert answer["type"] == "lifespan.startup.complete"
        lines = [r.getMessage() for r in caplog.records]
        assert len(lines) == 1
        assert "not ready within startup_timeout=0.2 s" in lines[0]
        app = app_on(slow_url, startup_timeout=0.2, require_storage=True)
        async with lifespan(app) as answer:
            assert answer["type"] == "lifespan.startup.failed"
        assert "not ready within startup_timeout=0.2 s" in answer["message"]


@pytest.mark.slow
def test_uvicorn_exits_on_a_wrong_password(locked: RedisProcess) -> None:
    """Under a real uvicorn the deploy stops: the server exits, and its output names the
    storage (password hidden) and the cause."""
    url = f"redis://:wrong-pw@{_port(locked)}/0"
    with pytest.raises(StartupError) as failed, uvicorn_server(
            {"RATELIMIT_STORAGE_URL": url}, timeout=30):
        pass
    output = str(failed.value)
    assert "exit code None" not in output  # it exited, it did not hang
    assert f"ratelimit_mw: storage 'redis://:***@{_port(locked)}/0' is misconfigured" in output
    assert "wrong-pw" not in output

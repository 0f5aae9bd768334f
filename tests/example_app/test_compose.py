"""docker-compose.yml and the Dockerfile, checked without a Docker engine.

The file is parsed (with PyYAML when installed, else a small parser of the block
YAML subset the file is written in), and the app's command line and health check
are run for real against the test Redis, on loopback.
"""

from __future__ import annotations

import importlib.util
import json
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from .conftest import FREE, ROOT, ExampleServer

COMPOSE = ROOT / "docker-compose.yml"
BIN = Path(sys.executable).parent


def _scalar(text: str) -> Any:
    text = text.strip()
    if text.startswith("["):
        return json.loads(text)  # flow lists are written JSON-style: ["CMD", "..."]
    if text.startswith('"'):
        return json.loads(text)
    if text.isdigit():
        return int(text)
    return text


def parse_block_yaml(source: str) -> Any:
    """Block mappings, block lists of scalars, quoted or plain scalars, JSON-style flow
    lists, comments: the subset docker-compose.yml uses."""
    lines = []
    for raw in source.splitlines():
        stripped = raw.split(" #", 1)[0].rstrip() if not raw.lstrip().startswith("#") else ""
        if stripped.strip():
            lines.append((len(stripped) - len(stripped.lstrip()), stripped.strip()))

    def block(i: int, indent: int) -> tuple[Any, int]:
        if lines[i][1].startswith("- "):
            items = []
            while i < len(lines) and lines[i][0] == indent and lines[i][1].startswith("- "):
                items.append(_scalar(lines[i][1][2:]))
                i += 1
            return items, i
        mapping: dict[str, Any] = {}
        while i < len(lines) and lines[i][0] == indent:
            key, sep, rest = lines[i][1].partition(":")
            assert sep, f"not a mapping entry: {lines[i][1]!r}"
            i += 1
            if rest.strip():
                mapping[key] = _scalar(rest)
            else:
                assert i < len(lines) and lines[i][0] > indent, f"{key}: has no value"
                mapping[key], i = block(i, lines[i][0])
        return mapping, i

    parsed, end = block(0, lines[0][0])
    assert end == len(lines), f"unparsed YAML from line {lines[end]}"
    return parsed


def load_compose() -> Any:
    text = COMPOSE.read_text()
    ours = parse_block_yaml(text)
    if importlib.util.find_spec("yaml") is not None:
        import yaml

        assert yaml.safe_load(text) == ours
    return ours


def test_compose_file_declares_redis_and_the_app_with_health_checks() -> None:
    """Two services; the app is built here, runs on Redis, and waits for Redis's health."""
    compose = load_compose()
    redis, app = compose["services"]["redis"], compose["services"]["app"]
    assert redis["image"].startswith("redis:7")
    assert redis["healthcheck"]["test"] == ["CMD", "redis-cli", "ping"]
    assert app["build"] == "."
    assert app["environment"]["RATELIMIT_STORAGE_URL"] == "redis://redis:6379/0"
    assert app["depends_on"] == {"redis": {"condition": "service_healthy"}}
    assert app["healthcheck"]["test"][0] == "CMD"
    assert app["ports"] == ["8000:8000"]
    assert (ROOT / "Dockerfile").read_text().count("example_app") >= 2


def test_the_workers_share_a_fresh_metrics_directory() -> None:
    """The app's workers sum their metrics in a tmpfs, empty at every start, which the
    image creates for its user too."""
    app = load_compose()["services"]["app"]
    directory = app["environment"]["PROMETHEUS_MULTIPROC_DIR"]
    assert app["tmpfs"] == [directory]
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert f"PROMETHEUS_MULTIPROC_DIR={directory}" in dockerfile
    assert "--extra prometheus" in dockerfile  # the extra installed


def test_the_monitoring_profile_runs_prometheus_and_grafana_on_the_deploy_files() -> None:
    """Prometheus scrapes the app; Grafana is provisioned with it and the dashboard."""
    services = load_compose()["services"]
    prometheus, grafana = services["prometheus"], services["grafana"]
    assert prometheus["profiles"] == grafana["profiles"] == ["monitoring"]
    assert "app" not in services["app"].get("profiles", [])
    for service in (prometheus, grafana):
        for volume in service["volumes"]:
            assert (ROOT / volume.split(":")[0]).exists(), volume
    import yaml  # mkdocs's dependency, so the test command's

    scrape = yaml.safe_load((ROOT / "deploy" / "prometheus.yml").read_text())
    assert scrape["scrape_configs"][0]["static_configs"][0]["targets"] == ["app:8000"]


def test_the_parser_refuses_what_it_does_not_understand() -> None:
    with pytest.raises(AssertionError):
        parse_block_yaml("services:\n  app\n")


@pytest.mark.redis
@pytest.mark.slow
def test_the_compose_command_line_and_health_check_run(
    redis_url: str, redis_prefix: str, tmp_path: Path,
) -> None:
    """The app service's command and environment, on loopback and the test Redis (and
    a metrics directory of the test's), serve the example; its health check command
    exits 0 against it."""
    app = load_compose()["services"]["app"]
    command = list(app["command"])
    assert command[:2] == ["uvicorn", "example_app.main:app"]
    server = ExampleServer({**app["environment"], "RATELIMIT_STORAGE_URL": redis_url,
                            "RATELIMIT_STORAGE_PREFIX": redis_prefix,
                            "PROMETHEUS_MULTIPROC_DIR": str(tmp_path)})
    command[command.index("--host") + 1] = "127.0.0.1"  # only loopback in the tests
    command[command.index("--port") + 1] = str(server.port)
    server.command = [str(BIN / command[0]), *command[1:]]
    server.start()
    try:
        response = httpx.get(f"{server.url}/api/v1/hello", headers=FREE)
        assert response.status_code == 200
        assert "ratelimit_decisions_total" in httpx.get(f"{server.url}/metrics").text
        assert app["healthcheck"]["test"][1] == "python"
        check = [sys.executable, *app["healthcheck"]["test"][2:]]
        check = [part.replace("127.0.0.1:8000", f"127.0.0.1:{server.port}") for part in check]
        done = subprocess.run(check, capture_output=True, timeout=30)
        assert done.returncode == 0, done.stderr
    finally:
        server.close()


def _run_example_options() -> list[str]:
    """The uvicorn options ``scripts/run-example`` passes, but for the address."""
    script = (ROOT / "scripts" / "run-example").read_text()
    words = shlex.split(next(line for line in script.splitlines() if line.startswith("exec ")))
    options = words[words.index("example_app.main:app") + 1:]
    kept: list[str] = []
    for word in options:
        if kept and kept[-1] in ("--host", "--port"):
            kept.pop()
        elif word != "$@":
            kept.append(word)
    return kept


def test_every_run_command_leaves_forwarding_headers_to_the_rate_limiter() -> None:
    """scripts/run-example, the Dockerfile and docker-compose.yml all turn uvicorn's own
    X-Forwarded-For handling off (it believes any loopback client by default)."""
    compose = list(load_compose()["services"]["app"]["command"])
    dockerfile = next(line for line in (ROOT / "Dockerfile").read_text().splitlines()
                      if line.startswith("CMD "))
    assert "--no-proxy-headers" in _run_example_options()
    assert "--no-proxy-headers" in compose
    assert "--no-proxy-headers" in json.loads(dockerfile.removeprefix("CMD "))


@pytest.mark.slow
@pytest.mark.parametrize(("trusted", "expected"), [
    ("", [200] * 5 + [429]),  # spoofed from loopback: still the one anonymous client
    ("127.0.0.1", [200] * 6),  # loopback as the trusted proxy: six clients
])
def test_the_run_command_keys_anonymous_callers_as_the_settings_say(
    trusted: str, expected: list[int],
) -> None:
    """Run as scripts/run-example runs it: a client on loopback can't pick its own
    anonymous counter with X-Forwarded-For, unless RATELIMIT_TRUSTED_PROXIES names
    loopback as a proxy."""
    env = {"RATELIMIT_TRUSTED_PROXIES": trusted} if trusted else {}
    server = ExampleServer(env, args=_run_example_options()).start()
    try:
        codes = [httpx.get(f"{server.url}/api/v1/hello",
                           headers={"X-Forwarded-For": f"203.0.113.{i}"}).status_code
                 for i in range(6)]
    finally:
        server.close()
    assert codes == expected

"""Settings from RATELIMIT_* environment variables and TOML files."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError
from starlette.responses import PlainTextResponse

from ratelimit_mw import ConfigError, MemoryStorage, RateLimitMiddleware
from ratelimit_mw.settings import RateLimitSettings
from tests.conftest import FakeClock

from .conftest import client_for, make_app

TOML = """
storage_url = "memory://"
header_style = "legacy+draft-11"
failure_mode = "closed"
trusted_proxies = ["10.0.0.0/8"]
exempt_paths = ["/health"]
default_tier = "free"

[tiers.free]
limits = [
    { rate = "10/minute", algorithm = "token_bucket", burst = 20, name = "burst" },
    { rate = "1000/day", name = "daily" },
]
concurrency = 4
shadow = ["daily"]

[tiers.pro]
limits = "100/minute; 10000/day"
algorithm = "fixed_window"

[[routes]]
path = "/search"
methods = ["GET"]
limits = "5/minute"
cost = 2
"""


def test_environment_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    """The four documented variables (and lists as comma-separated values) are read."""
    monkeypatch.setenv("RATELIMIT_STORAGE_URL", "redis://cache:6379/1")
    monkeypatch.setenv("RATELIMIT_HEADER_STYLE", "draft-11")
    monkeypatch.setenv("RATELIMIT_FAILURE_MODE", "memory")
    monkeypatch.setenv("RATELIMIT_TRUSTED_PROXIES", "10.0.0.1, 192.168.0.0/16")
    settings = RateLimitSettings()
    assert settings.storage_url == "redis://cache:6379/1"
    assert settings.header_style == "draft-11"
    assert settings.failure_mode == "memory"
    assert settings.trusted_proxies == ["10.0.0.1", "192.168.0.0/16"]


def test_tiers_from_environment_json(monkeypatch: pytest.MonkeyPatch) -> None:
    """RATELIMIT_TIERS takes JSON."""
    monkeypatch.setenv("RATELIMIT_TIERS", '{"gold": {"limits": "50/second"}}')
    table = RateLimitSettings().build_tiers()
    assert table.default.name == "gold"
    assert table.default.limits[0].rate.amount == 50  # type: ignore[index]


@pytest.mark.parametrize(("variable", "value"), [
    ("RATELIMIT_TIERS", '{"gold": {"limits": "50/second"}'),
    ("RATELIMIT_ROUTES", "/api/* 5/minute"),
])
def test_a_variable_that_is_not_json_is_named_and_quoted(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, variable: str, value: str,
) -> None:
    """Not JSON where JSON is expected: the error names the variable and quotes it,
    read alone or beside a TOML file (a long value is cut short)."""
    monkeypatch.setenv(variable, value)
    with pytest.raises(ConfigError, match=f"{variable} must be JSON .*got '") as error:
        RateLimitSettings()
    assert value in str(error.value)
    path = tmp_path / "ratelimit.toml"
    path.write_text(TOML)
    with pytest.raises(ConfigError, match=f"{variable} must be JSON"):
        RateLimitSettings.from_toml(path)
    monkeypatch.setenv(variable, value + " " * 100 + "tail")
    with pytest.raises(ConfigError, match=r"\.\.\.'$") as error:
        RateLimitSettings()
    assert "tail" not in str(error.value)


def test_toml_file(tmp_path: Path) -> None:
    """A TOML file configures tiers (any algorithm), routes and the rest."""
    path = tmp_path / "ratelimit.toml"
    path.write_text(TOML)
    settings = RateLimitSettings.from_toml(path)
    table = settings.build_tiers()
    assert list(table.tiers) == ["free", "pro"]
    free = table.default
    assert free.names == ("burst", "daily")
    assert free.concurrency == 4
    assert free.shadow == frozenset({"daily"})
    assert {lim.algorithm for lim in table.tiers["pro"].limits} == {"fixed_window"}  # type: ignore[union-attr]
    [rule] = settings.build_routes()
    assert rule.methods == frozenset({"GET"}) and rule.cost == 2


def test_environment_overrides_toml(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An environment variable wins over the file."""
    path = tmp_path / "ratelimit.toml"
    path.write_text(TOML)
    monkeypatch.setenv("RATELIMIT_HEADER_STYLE", "draft-7")
    settings = RateLimitSettings.from_toml(path)
    assert settings.header_style == "draft-7"
    assert settings.failure_mode == "closed"


def test_toml_table(tmp_path: Path) -> None:
    """Settings may live in a table of a larger file, e.g. [tool.ratelimit]."""
    path = tmp_path / "pyproject.toml"
    path.write_text('[tool.ratelimit]\ndefault_limits = "7/second"\n')
    settings = RateLimitSettings.from_toml(path, table="tool.ratelimit")
    assert settings.build_tiers().default.limits[0].rate.amount == 7  # type: ignore[index]
    with pytest.raises(ConfigError, match="no table"):
        RateLimitSettings.from_toml(path, table="tool.other")


@pytest.mark.parametrize(("field", "value", "message"), [
    ("header_style", "draft-99", "unknown header style"),
    ("failure_mode", "maybe", "unknown failure mode"),
    ("default_limits", "lots/minute", "couldn't parse rate"),
    ("tiers", {"free": {"limits": [{"rate": "1/minute", "algorithm": "magic"}]}},
     "unknown algorithm"),
    ("routes", [{"path": "/x", "limits": "1/minute", "algorithm": "nope"}], "unknown algorithm"),
    ("trusted_proxies", ["example.com"], "trusted proxy"),
    ("trusted_proxies", ["10.0.0.1/8"], "has host bits set; write the network '10.0.0.0/8'"),
    ("response_format", "xml", "unknown response format"),
    ("forwarded_header", "x-real-ip", "forwarded_header must be 'x-forwarded-for' or"),
    ("ipv6_prefix", True, "ipv6_prefix must be a number, got True"),
    ("storage_timeout", True, "storage_timeout must be a number, got True"),
    ("storage_timeout", float("nan"), "storage_timeout must be a positive number of seconds"),
    ("storage_timeout", 0, "storage_timeout must be a positive number of seconds, got 0"),
    ("recovery_interval", -5, "recovery_interval must be a positive number of seconds"),
    ("recovery_interval", float("inf"), "recovery_interval must be a positive number"),
    ("blocked_cache_size", -5, "blocked_cache_size must be 0 .off. or a positive number"),
    ("max_pending_decisions", 0, "max_pending_decisions must be a whole number of decisions, "
                                 "1 or more .default 1000., got 0"),
    ("max_pending_decisions", True, "max_pending_decisions must be a number, got True"),
    ("tier_header", "x-t\u20acr", "tier_header must be an HTTP header name"),
    ("api_key_header", "bad header", "api_key_header must be an HTTP header name"),
    ("routes", [{"path": "/x", "methods": ["G E T"]}], "'G E T' is not an HTTP method"),
    ("routes", [{"path": "/x", "methods": [""]}], "'' is not an HTTP method"),
    ("storage_url", "memory://?bogus=1", "unknown or repeated option 'bogus'"),
    ("storage_url", "memory://somehost", "takes no host or path"),
])
def test_bad_settings_fail_when_loaded(field: str, value: object, message: str) -> None:
    """Bad styles, modes, rates, algorithms and tier names fail at load, clearly."""
    with pytest.raises(ValidationError, match=message):
        RateLimitSettings(**{field: value})  # type: ignore[arg-type]


def test_bad_environment_values_fail_naming_them(monkeypatch: pytest.MonkeyPatch) -> None:
    """From the environment too: a bad value fails at load, naming the variable's field."""
    monkeypatch.setenv("RATELIMIT_STORAGE_TIMEOUT", "nan")
    with pytest.raises(ValidationError, match="storage_timeout must be a positive number"):
        RateLimitSettings()
    monkeypatch.delenv("RATELIMIT_STORAGE_TIMEOUT")
    monkeypatch.setenv("RATELIMIT_FORWARDED_HEADER", "Forwarded")
    monkeypatch.setenv("RATELIMIT_TIER_HEADER", "")
    settings = RateLimitSettings()
    assert (settings.forwarded_header, settings.tier_header) == ("forwarded", None)


def test_the_middleware_takes_max_keys_from_a_memory_url() -> None:
    middleware = RateLimitMiddleware(
        PlainTextResponse("ok"),
        settings=RateLimitSettings(storage_url="memory://?max_keys=3"),
    )
    assert isinstance(middleware.storage, MemoryStorage)
    assert middleware.storage.max_keys == 3


def test_a_misspelt_variable_is_warned_of(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
) -> None:
    """A RATELIMIT_ variable that sets nothing (a typo) is named in a warning, with the
    setting it probably meant; the setting keeps its default."""
    monkeypatch.setenv("RATELIMIT_FAILURE_MDOE", "closed")
    settings = RateLimitSettings()
    assert settings.failure_mode == "open"
    assert ("the environment variable RATELIMIT_FAILURE_MDOE sets nothing (did you mean "
            "RATELIMIT_FAILURE_MODE?)") in caplog.text


def test_unknown_default_tier_fails_when_loaded() -> None:
    """default_tier must name one of the configured tiers."""
    with pytest.raises(ValidationError, match="unknown tier 'gold'"):
        RateLimitSettings(tiers={"free": {"limits": "1/minute"}}, default_tier="gold")


async def test_middleware_reads_toml_settings(
    tmp_path: Path, clock: FakeClock, memory: MemoryStorage,
) -> None:
    """Settings loaded from TOML drive the middleware (here: the free tier's headers)."""
    path = tmp_path / "ratelimit.toml"
    path.write_text(TOML)
    app = make_app(settings=RateLimitSettings.from_toml(path), storage=memory, clock=clock)
    async with client_for(app) as client:
        response = await client.get("/")
    assert response.headers["ratelimit-policy"] == (
        '"burst";q=20;w=60,"concurrent";q=4;qu="concurrent-requests"')


def test_partition_key_needs_draft11() -> None:
    """pk only exists in draft-11's RateLimit header: asking for it otherwise is refused."""
    with pytest.raises(ValidationError, match=r"partition_key.*'legacy'"):
        RateLimitSettings(partition_key=True)
    assert RateLimitSettings(partition_key=True, header_style="legacy+draft-11").partition_key


@pytest.mark.parametrize(("argument", "value", "message"), [
    ("settings", {"header_style": "legacy"}, "settings must be a RateLimitSettings"),
    ("storage", "redis://127.0.0.1:6379", "storage must be a ratelimit_mw Storage"),
    ("breaker", 5, "breaker must be a circuit breaker"),
    ("tier_resolver", "pro", "tier_resolver must be a callable"),
    ("on_denied", 429, "on_denied must be a callable"),
    ("on_decision", [], "on_decision must be a callable"),
    ("clock", 1700000000.0, "clock must be a callable"),
    ("key", 5, "key must be 'ip', 'api_key', 'user' or a callable"),
])
def test_objects_that_cannot_work_fail_at_start_up(
    argument: str, value: object, message: str,
) -> None:
    """An object argument of the wrong kind is refused when the middleware is built, with
    its name, rather than failing on the first request (or never)."""
    with pytest.raises(TypeError, match=message):
        RateLimitMiddleware(make_app(), **{argument: value})


def test_a_setting_given_to_the_middleware_is_a_type_error_naming_it() -> None:
    """Settings go through ``settings=``: a field passed as a keyword fails at start-up."""
    with pytest.raises(TypeError, match="header_style"):
        RateLimitMiddleware(make_app(), header_style="draft-11")  # type: ignore[call-arg]

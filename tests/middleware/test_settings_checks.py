"""Settings that would be silently ignored are refused or named at start-up, and the
environment is checked together with the TOML file it overrides."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from pydantic import ValidationError
from starlette.applications import Starlette

from ratelimit_mw import ConfigError, Limit, MemoryStorage, RateLimitMiddleware, TierByAPIKey
from ratelimit_mw.routes import limit
from ratelimit_mw.settings import RateLimitSettings
from ratelimit_mw.tiers import Tier


@pytest.mark.parametrize(("env", "check"), [
    # draft-11 comes from the file: partition_key alone would be refused against legacy
    ({"RATELIMIT_PARTITION_KEY": "true"}, lambda s: s.partition_key),
    # the default tier names a tier of the environment's, not of the file's
    ({"RATELIMIT_TIERS": '{"pro": {"limits": "50/minute"}}', "RATELIMIT_DEFAULT_TIER": "pro"},
     lambda s: list(s.tiers) == ["pro"] and s.default_tier == "pro"),
])
def test_the_environment_is_validated_with_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, env: dict[str, str], check: object,
) -> None:
    path = tmp_path / "ratelimit.toml"
    path.write_text('header_style = "draft-11"\ndefault_tier = "free"\n'
                    '[tiers.free]\nlimits = "10/minute"\n')
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    settings = RateLimitSettings.from_toml(path)
    assert settings.header_style == "draft-11"
    assert check(settings)  # type: ignore[operator]


def test_a_bad_variable_is_still_named_with_a_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    path = tmp_path / "ratelimit.toml"
    path.write_text('header_style = "draft-11"\n')
    monkeypatch.setenv("RATELIMIT_FAILURE_MODE", "bogus")
    with pytest.raises((ConfigError, ValidationError), match="bogus"):
        RateLimitSettings.from_toml(path)


def test_default_limits_beside_tiers_are_refused() -> None:
    with pytest.raises(ValidationError, match=r"default_limits='1/minute' applies only when"):
        RateLimitSettings(default_limits="1/minute", tiers={"free": {"limits": "100/minute"}})
    assert RateLimitSettings(tiers={"free": {"limits": "100/minute"}}).tiers  # unset: fine


def test_an_exempt_rule_with_limits_is_refused() -> None:
    with pytest.raises(ValidationError, match="'/admin/\\*' is exempt and has limits"):
        RateLimitSettings(routes=[{"path": "/admin/*", "exempt": True, "limits": "1/minute"}])


def test_limit_objects_take_no_shaping_arguments() -> None:
    with pytest.raises(ConfigError, match="a Limit carries its own"):
        limit([Limit("10/minute")], "token_bucket", burst=50, name="uploads")
    assert limit([Limit("10/minute")], cost=2).cost == 2


def test_tiers_and_resolvers_that_replace_settings_are_named(
    caplog: pytest.LogCaptureFixture,
) -> None:
    settings = RateLimitSettings(tiers={"free": {"limits": "5/minute"}}, tier_header="x-plan",
                                 trusted_proxies=["10.0.0.0/8"])
    with caplog.at_level(logging.WARNING, logger="ratelimit_mw"):
        RateLimitMiddleware(Starlette(), settings=settings, tiers=[Tier("basic", "50/minute")],
                            tier_resolver=TierByAPIKey({}),
                            storage=MemoryStorage())
    assert "replace those of its settings (free)" in caplog.text
    assert "tier_header='x-plan' is not read" in caplog.text

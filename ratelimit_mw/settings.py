"""Configuration from ``RATELIMIT_*`` environment variables and from a TOML file.

Example TOML (top level, or under the table named by ``table=``)::

    storage_url = "redis://localhost:6379/0"
    header_style = "legacy+draft-11"
    failure_mode = "memory"
    trusted_proxies = ["10.0.0.0/8"]
    exempt_paths = ["/health"]
    default_tier = "free"

    [tiers.free]
    limits = [
        { rate = "10/minute", algorithm = "token_bucket", burst = 20, name = "burst" },
        { rate = "1000/day", name = "daily" },
    ]

    [[routes]]
    path = "/search"
    methods = ["GET"]
    limits = "5/minute"
    cost = 2

Environment variables override the file: ``RATELIMIT_HEADER_STYLE=draft-11``;
lists are comma-separated (``RATELIMIT_TRUSTED_PROXIES=10.0.0.1,10.0.0.2``);
``RATELIMIT_TIERS`` and ``RATELIMIT_ROUTES`` take JSON.
"""

from __future__ import annotations

import difflib
import logging
import math
import os
import tomllib
from collections.abc import Iterable
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    SecretStr,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic.fields import FieldInfo
from pydantic_settings import (
    BaseSettings,
    EnvSettingsSource,
    NoDecode,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    SettingsError,
)

from .checks import header_name, positive_seconds
from .client_ip import TrustedProxies, check_forwarded_header
from .errors import ConfigError
from .failure import DEFAULT_MAX_PENDING, FailureMode, check_max_pending, check_mode
from .headers import parse_header_style
from .limits import as_limits
from .responses import check_format
from .routes import RouteRule
from .settings_tables import CostConfig, LimitConfig, RouteConfig, TierConfig
from .storage import check_storage_url
from .storage.base import UsageRetention
from .tiers import Tier, TierTable

__all__ = ["CostConfig", "LimitConfig", "RateLimitSettings", "RouteConfig", "TierConfig"]

_log = logging.getLogger("ratelimit_mw")


_warned_variables: set[str] = set()


def _warn_unknown_variables(fields: Iterable[str]) -> None:
    """Warn, once each, of ``RATELIMIT_*`` environment variables that set nothing (a
    typo would otherwise leave its setting at the default without a word). A warning,
    not an error: other tools read variables of that prefix too."""
    known = {f"RATELIMIT_{name.upper()}" for name in fields}
    for variable in os.environ:
        name = variable.upper()
        if (name.startswith("RATELIMIT_") and name not in known
                and name not in _warned_variables):
            _warned_variables.add(name)
            close = difflib.get_close_matches(name, sorted(known), n=1)
            _log.warning("ratelimit_mw: the environment variable %s sets nothing%s", variable,
                         f" (did you mean {close[0]}?)" if close else "")


def _split(value: Any) -> Any:
    """``"a, b"`` from an environment variable -> ``["a", "b"]``."""
    if isinstance(value, str):
        return [item.strip() for item in value.split(",") if item.strip()]
    return value


class _Environment(EnvSettingsSource):
    """The ``RATELIMIT_*`` variables; one that should hold JSON (``RATELIMIT_TIERS``,
    ``RATELIMIT_ROUTES``) and doesn't is a ConfigError naming it and quoting it."""

    def prepare_field_value(
        self, field_name: str, field: FieldInfo, value: Any, value_is_complex: bool,
    ) -> Any:
        try:
            return super().prepare_field_value(field_name, field, value, value_is_complex)
        except ValueError as exc:
            text = str(value)
            shown = text if len(text) <= 80 else f"{text[:80]}..."
            msg = (f"RATELIMIT_{field_name.upper()} must be JSON ({exc}), "
                   f"got {shown!r}")
            raise ConfigError(msg) from exc

    def __call__(self) -> dict[str, Any]:
        try:
            return super().__call__()
        except SettingsError as exc:
            if isinstance(exc.__cause__, ConfigError):
                raise exc.__cause__ from None
            raise


class RateLimitSettings(BaseSettings):
    """Everything the middleware can be configured with, validated when loaded."""

    model_config = SettingsConfigDict(env_prefix="RATELIMIT_", extra="forbid", frozen=True)

    storage_url: str = "memory://"
    storage_prefix: str = "ratelimit:"
    storage_timeout: float = 0.05
    storage_connect_timeout: float = 1.0
    startup_timeout: float = 5.0
    require_storage: bool = False
    recovery_interval: float = 2.0
    failure_mode: FailureMode = "open"
    max_pending_decisions: int = DEFAULT_MAX_PENDING
    header_style: str = "legacy"
    partition_key: bool = False
    response_format: Literal["json", "problem+json"] = "json"
    key: Literal["ip", "api_key", "user"] = "ip"
    api_key_header: str = "x-api-key"
    trusted_proxies: Annotated[list[str], NoDecode] = []
    forwarded_header: str = "x-forwarded-for"
    ipv6_prefix: int = 64
    default_limits: str = "100/minute"
    default_tier: str | None = None
    tiers: dict[str, TierConfig] = {}
    tier_header: str | None = None
    routes: list[RouteConfig] = []
    exempt_paths: Annotated[list[str], NoDecode] = []
    shadow: bool = False
    limit_websockets: bool = False
    websocket_messages: str = ""
    websocket_connection_messages: str = ""
    websocket_over_limit: Literal["close", "drop"] = "close"
    max_held_requests: int = 1000
    """Requests this worker holds at once for their turn (a leaky bucket with
    ``max_delay``); one more that would wait is refused with 429 at once."""
    blocked_cache_size: int = 10_000
    concurrency_lease: float = 30.0
    quota_history: bool = False
    usage_retention_hours: int = 7 * 24
    usage_retention_days: int = 90
    admin_token: SecretStr | None = None
    """The bearer token of the overrides' admin API (``RATELIMIT_ADMIN_TOKEN``)."""

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return init_settings, _Environment(settings_cls), dotenv_settings, file_secret_settings

    @field_validator("trusted_proxies", "exempt_paths", mode="before")
    @classmethod
    def _lists(cls, value: Any) -> Any:
        return _split(value)

    @field_validator("storage_timeout", "storage_connect_timeout", "startup_timeout",
                     "recovery_interval", "concurrency_lease", "max_pending_decisions",
                     "ipv6_prefix", "blocked_cache_size", "usage_retention_hours",
                     "usage_retention_days", "max_held_requests", mode="before")
    @classmethod
    def _numbers(cls, value: Any, info: ValidationInfo) -> Any:
        # A TOML or JSON true is not 1: refused, not coerced.
        if isinstance(value, bool):
            msg = f"{info.field_name} must be a number, got {value!r}"
            raise ConfigError(msg)
        return value

    @field_validator("storage_timeout", "storage_connect_timeout", "startup_timeout",
                     "recovery_interval")
    @classmethod
    def _seconds(cls, value: float, info: ValidationInfo) -> float:
        return positive_seconds(str(info.field_name), value)

    @field_validator("max_pending_decisions")
    @classmethod
    def _max_pending(cls, value: int) -> int:
        return check_max_pending(value)

    @field_validator("blocked_cache_size")
    @classmethod
    def _cache_size(cls, value: int) -> int:
        if value < 0:
            msg = f"blocked_cache_size must be 0 (off) or a positive number, got {value!r}"
            raise ConfigError(msg)
        return value

    @field_validator("max_held_requests")
    @classmethod
    def _held(cls, value: int) -> int:
        if value < 0:
            msg = (f"max_held_requests must be 0 (hold none: refuse what would wait) or a "
                   f"positive number, got {value!r}")
            raise ConfigError(msg)
        return value

    @field_validator("websocket_messages", "websocket_connection_messages")
    @classmethod
    def _message_rate(cls, value: str, info: ValidationInfo) -> str:
        if value and len(as_limits(value)) != 1:
            msg = f"{info.field_name}={value!r} names several rates; give one, e.g. '20/second'"
            raise ConfigError(msg)
        return value

    @field_validator("api_key_header", "tier_header")
    @classmethod
    def _header(cls, value: str | None, info: ValidationInfo) -> str | None:
        if info.field_name == "tier_header" and not (value or "").strip():
            return None  # unset
        return header_name(value, str(info.field_name))

    @field_validator("header_style")
    @classmethod
    def _style(cls, value: str) -> str:
        parse_header_style(value)
        return value

    @field_validator("storage_url")
    @classmethod
    def _storage_url(cls, value: str) -> str:
        # memory:// options, checked now; any other URL when the storage is built (at
        # start-up), where the error hides its password: pydantic would quote it here.
        if value.lower().startswith("memory:"):
            check_storage_url(value)
        return value

    @field_validator("forwarded_header")
    @classmethod
    def _forwarded(cls, value: str) -> str:
        return check_forwarded_header(value)

    @field_validator("failure_mode", mode="before")
    @classmethod
    def _mode(cls, value: Any) -> Any:
        return check_mode(value) if isinstance(value, str) else value

    @field_validator("response_format", mode="before")
    @classmethod
    def _format(cls, value: Any) -> Any:
        return check_format(value) if isinstance(value, str) else value

    @model_validator(mode="after")
    def _build_check(self) -> RateLimitSettings:
        # Build everything once so a bad rate, algorithm or tier name fails at load time.
        _warn_unknown_variables(type(self).model_fields)
        TrustedProxies(self.trusted_proxies)
        self.build_tiers()
        self.build_routes()
        if not 0 < self.concurrency_lease < math.inf:
            msg = (f"concurrency_lease must be a positive number of seconds, "
                   f"got {self.concurrency_lease!r}")
            raise ConfigError(msg)
        UsageRetention(self.usage_retention_hours, self.usage_retention_days).check()
        if self.partition_key and "draft-11" not in parse_header_style(self.header_style):
            msg = (f"partition_key adds pk to draft-11's RateLimit header, but header_style "
                   f"is {self.header_style!r}; use 'draft-11' or 'legacy+draft-11'")
            raise ConfigError(msg)
        if not 1 <= self.ipv6_prefix <= 128:
            msg = f"ipv6_prefix must be from 1 to 128, got {self.ipv6_prefix}"
            raise ConfigError(msg)
        if self.tiers and "default_limits" in self.model_fields_set:
            msg = (f"default_limits={self.default_limits!r} applies only when no tiers are "
                   f"set, and tiers are ({', '.join(self.tiers)}): give the default tier "
                   f"those limits instead")
            raise ConfigError(msg)
        return self

    @property
    def usage_retention(self) -> UsageRetention:
        """How long the usage history (quota history) is kept."""
        return UsageRetention(self.usage_retention_hours, self.usage_retention_days)

    def build_tiers(self) -> TierTable:
        """The configured tiers, or one ``default`` tier of ``default_limits``."""
        if self.tiers:
            tiers = [config.build(name) for name, config in self.tiers.items()]
        else:
            tiers = [Tier(self.default_tier or "default", self.default_limits)]
        return TierTable(tiers, self.default_tier)

    def build_routes(self) -> list[RouteRule]:
        """The configured route rules."""
        return [config.build() for config in self.routes]

    @classmethod
    def from_toml(cls, path: str | Path, *, table: str | None = None) -> RateLimitSettings:
        """Settings from a TOML file (optionally one dotted ``table`` of it, e.g.
        ``"tool.ratelimit"``); ``RATELIMIT_*`` environment variables override it."""
        try:
            with open(path, "rb") as file:
                data: Any = tomllib.load(file)
        except (OSError, tomllib.TOMLDecodeError) as exc:
            msg = f"couldn't read rate-limit settings from {str(path)!r}: {exc}"
            raise ConfigError(msg) from exc
        for part in table.split(".") if table else ():
            data = data.get(part) if isinstance(data, dict) else None
            if not isinstance(data, dict):
                msg = f"{str(path)!r} has no table [{table}]"
                raise ConfigError(msg)
        # The variables as they are, validated once together with the file (validated
        # alone, against the defaults, a valid combination could be refused).
        merged = {**data, **_Environment(cls)()}
        return cls.model_validate(merged)

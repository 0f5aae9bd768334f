"""The tables of the settings: tiers, routes, their limits and where a limit's real cost
is read, as TOML or ``RATELIMIT_TIERS``/``RATELIMIT_ROUTES`` JSON gives them, each
built into what the middleware runs on."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, StrictInt

from .charges import CostReader, cost_from_header, cost_from_state
from .errors import ConfigError
from .limits import Limit, as_limits
from .routes import RouteRule
from .tiers import Tier

__all__ = ["CostConfig", "LimitConfig", "LimitsField", "RouteConfig", "TierConfig"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class CostConfig(_Strict):
    """Where a limit's real cost is read after the response: ``{header = "x-tokens-used",
    remove = true}`` or ``{state = "tokens"}`` (a function is given in code)."""

    header: str = ""
    remove: bool = False
    state: str = ""

    def build(self) -> CostReader:
        if bool(self.header) == bool(self.state):
            msg = (f"cost={self.model_dump(exclude_defaults=True)!r} names where the real "
                   f"cost is read: give header or state, one of them")
            raise ConfigError(msg)
        if self.header:
            return cost_from_header(self.header, remove=self.remove)
        return cost_from_state(self.state)


class LimitConfig(_Strict):
    """One limit: ``{rate = "10/minute", algorithm = "token_bucket", burst = 20}``, and
    how the response settles it: ``count = "failures"``, ``cost = {header = "..."}``,
    ``estimate = 500``, ``unit = "tokens"``; a leaky bucket that holds requests for their
    turn: ``max_delay = "5s"``."""

    rate: str
    algorithm: str = "sliding_window"
    burst: StrictInt | None = None  # strict: `burst = true` is an error, not 1
    name: str = ""
    count: str | list[StrictInt] | None = None
    cost: CostConfig | None = None
    estimate: StrictInt | None = None
    unit: str = "requests"
    max_delay: str | StrictInt | float = 0.0

    def build(self) -> Limit:
        return Limit(self.rate, self.algorithm, burst=self.burst, name=self.name,
                     count=self.count, cost=None if self.cost is None else self.cost.build(),
                     estimate=self.estimate, unit=self.unit, max_delay=self.max_delay)


LimitsField = str | list[str | LimitConfig]


def _limits(value: LimitsField, algorithm: str) -> list[Limit | str]:
    items = [value] if isinstance(value, str) else value
    out: list[Limit | str] = []
    for item in items:
        if isinstance(item, LimitConfig):
            out.append(item.build())
        else:
            out.extend(as_limits(item, algorithm))
    return out


class TierConfig(_Strict):
    """A tier: its limits (``algorithm`` applies to those given as plain rates)."""

    limits: LimitsField = []
    algorithm: str = "sliding_window"
    concurrency: StrictInt | None = None
    shadow: list[str] = []

    def build(self, name: str) -> Tier:
        return Tier(name, _limits(self.limits, self.algorithm),  # type: ignore[arg-type]
                    self.concurrency, frozenset(self.shadow))


class RouteConfig(_Strict):
    """Limits, cost or exemption for paths matching ``path`` and ``methods`` (see
    ``RouteRule``: ``cost`` counts against the tier's limits, 1 on the rule's own)."""

    path: str
    methods: list[str] = []
    limits: LimitsField = []
    algorithm: str = "sliding_window"
    cost: StrictInt = 1
    exempt: bool = False
    shadow: bool = False

    def build(self) -> RouteRule:
        if self.exempt and self.limits:
            msg = (f"route {self.path!r} is exempt and has limits {self.limits!r}: an exempt "
                   f"route is not limited at all; drop one of them")
            raise ConfigError(msg)
        return RouteRule(self.path, frozenset(self.methods),
                         _limits(self.limits, self.algorithm),  # type: ignore[arg-type]
                         self.cost, self.exempt, self.shadow)

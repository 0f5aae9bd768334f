"""Limits (a rate and an algorithm), and a limit's algorithm run on a counter's state."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from mypy_extensions import mypyc_attr

from .algorithms import (
    ALGORITHMS,
    ALIASES,
    RATE_ALGORITHMS,
    AlgorithmName,
    RawStep,
    Step,
    calendar_month,
    concurrency,
    fixed_window,
    gcra,
    sliding_log,
    sliding_window,
    token_bucket,
)
from .charges import Settlement, settlement_of
from .checks import is_token
from .errors import ConfigError
from .partitions import Partition
from .rates import MAX_AMOUNT, MAX_PERIOD, Rate, parse_rate, split_rates

__all__ = [
    "ALGORITHM_NAMES",
    "AlgorithmName",
    "Limit",
    "LimitKey",
    "as_limits",
    "decide",
    "run",
    "settle",
]

ALGORITHM_NAMES = RATE_ALGORITHMS
"""The rate algorithms. Besides them: ``concurrency`` counts requests in flight, and
``calendar_month`` is a fixed window over UTC calendar months (rate ``N/month``)."""
_MONTH = 30 * 86400


def _algorithm(name: object) -> AlgorithmName:
    """Normalise an algorithm name (``-`` or ``_``, the registry's aliases) or fail."""
    normal = str(name).strip().lower().replace("-", "_")
    normal = ALIASES.get(normal, normal)
    for known in ALGORITHMS:
        if normal == known:
            return known
    msg = f"unknown algorithm {name!r}; expected one of {', '.join(ALGORITHMS)}"
    raise ConfigError(msg)


@mypyc_attr(allow_interpreted_subclasses=True)
@dataclass(frozen=True, slots=True)
class Limit:
    """How many requests a key may make, and which algorithm counts them.

    ``burst`` applies to ``token_bucket`` and ``gcra`` only: how many requests may
    arrive at once, while ``rate`` is the sustained pace (it defaults to the rate's
    amount). ``name`` names the policy in headers.

    A limit may be charged by what the response says (``charges.py``): ``count``
    which responses count (``"failures"``, ``"successes"``, statuses), ``cost`` where
    the real cost is read after the response (``cost_from_header(...)``), ``estimate``
    what is reserved before the app runs (default: the request's cost). ``unit``
    names what the limit counts, in headers (``"tokens"``: ``X-RateLimit-*-Tokens``);
    ``per`` counts it apart by something the request says (``json_field("username")``);
    ``max_delay`` (the leaky bucket) holds a request for its turn instead of refusing it.

    >>> str(Limit(Rate(10, 60), "token_bucket", burst=20))
    'token_bucket 10/minute burst 20'
    """

    rate: Rate
    algorithm: AlgorithmName = "sliding_window"
    burst: int | None = None
    name: str = ""
    settlement: Settlement | None = None
    """How its charge is settled after the response (None: decided before, as usual)."""
    unit: str = "requests"
    per: Partition | None = None
    """What the request says that the limit is counted apart by (``partitions.py``)."""
    max_delay: float = 0.0
    """Seconds a request may be held for its turn instead of refused (``gcra``, the
    leaky bucket: shaping); 0 refuses what does not fit now."""
    max_delay_us: int = field(init=False, repr=False, compare=False)
    amount: int = field(init=False, repr=False, compare=False)
    capacity: int = field(init=False, repr=False, compare=False)
    period_us: int = field(init=False, repr=False, compare=False)
    uid: str = field(init=False, repr=False, compare=False)
    is_concurrency: bool = field(init=False, repr=False, compare=False)
    """True for a limit on requests in flight rather than a rate."""
    windowed: bool = field(init=False, repr=False, compare=False)
    """True where the state starts with a window's start and expires at a window's edge:
    numbers every caller counted in the same window shares."""
    _hash: int = field(init=False, repr=False, compare=False)

    # Written out rather than generated, the checked arguments typed object (here and in
    # the constructors below): see ``checks``.
    def __init__(self, rate: object, algorithm: object = "sliding_window", *,
                 burst: object = None, name: object = "", count: object = None,
                 cost: object = None, estimate: object = None,
                 unit: object = "requests", settlement: object = None,
                 per: object = None, max_delay: object = 0.0) -> None:
        set_ = object.__setattr__
        rate = parse_rate(rate)
        set_(self, "rate", rate)
        kind = _algorithm(algorithm)
        set_(self, "algorithm", kind)
        if burst is not None:
            if not ALGORITHMS[kind].burst:
                takers = " and ".join(name for name, known in ALGORITHMS.items() if known.burst)
                msg = f"burst={burst!r} only applies to {takers}, not {kind}"
                raise ConfigError(msg)
            if (isinstance(burst, bool) or not isinstance(burst, int)
                    or not 1 <= burst <= MAX_AMOUNT):
                msg = f"burst must be a positive integer of at most {MAX_AMOUNT:,}, got {burst!r}"
                raise ConfigError(msg)
            refill = burst * rate.period / rate.amount
            if refill > MAX_PERIOD:
                msg = (f"burst={burst} at {rate} would take {refill / 86400:,.0f} days to "
                       f"refill from empty, more than ten years ({MAX_PERIOD // 86400:,} days): "
                       f"lower the burst or raise the rate")
                raise ConfigError(msg)
        set_(self, "burst", burst)
        if kind == "calendar_month" and rate.period != _MONTH:
            msg = (f"calendar_month counts per calendar month; write the rate as "
                   f"'{rate.amount}/month', not {str(rate)!r}")
            raise ConfigError(msg)
        held = parse_delay(max_delay)
        # A shaped limit lets one through at once unless told otherwise: it smooths.
        capacity = burst if isinstance(burst, int) else 1 if held else rate.amount
        set_(self, "amount", rate.amount)
        set_(self, "capacity", capacity)
        set_(self, "period_us", rate.period_us)
        set_(self, "is_concurrency", kind == "concurrency")
        set_(self, "windowed", kind in ("fixed_window", "sliding_window", "calendar_month"))
        set_(self, "name", str(name) or self._default_name())
        # The storage identity of the counter: the shape, not the display name.
        set_(self, "uid", f"{kind}:{rate.amount}:{rate.period_us}:{capacity}")
        if settlement is None:  # else given whole (dataclasses.replace, unpickling)
            settlement = settlement_of(count, cost, estimate)
        elif not isinstance(settlement, Settlement) or (count, cost, estimate) != (None,) * 3:
            msg = f"settlement={settlement!r}: give count=, cost= and estimate= instead"
            raise ConfigError(msg)
        if settlement is not None and kind == "concurrency":
            msg = ("a concurrency limit holds one slot per request: it has no charge to "
                   "settle after the response (count=, cost=)")
            raise ConfigError(msg)
        set_(self, "settlement", settlement)
        if not isinstance(unit, str) or not is_token(unit) or unit != unit.lower():
            msg = f"unit must be a lower-case word such as 'tokens', got {unit!r}"
            raise ConfigError(msg)
        set_(self, "unit", unit)
        if per is not None and not callable(per):
            msg = f"per={per!r} is not a partition; use e.g. per=json_field('username')"
            raise ConfigError(msg)
        set_(self, "per", per)
        if held and kind != "gcra":
            msg = (f"max_delay={max_delay!r} holds requests for their turn, which the leaky "
                   f"bucket does (algorithm 'leaky_bucket' or 'gcra'), not {kind}")
            raise ConfigError(msg)
        set_(self, "max_delay", held)
        set_(self, "max_delay_us", round(held * 1_000_000))
        # Limits key the per-request lookups (policy names, header texts): hash once.
        set_(self, "_hash", hash((rate, kind, burst, self.name, settlement, unit, id(per),
                                  held)))

    def __hash__(self) -> int:
        return self._hash

    def __reduce__(self) -> tuple[Any, ...]:
        # Rebuilt, not copied: the cached hash is only valid in the process that made it.
        return (_rebuild_limit, (type(self), self.rate, self.algorithm, self.burst, self.name,
                                 self.settlement, self.unit, self.per, self.max_delay))

    @classmethod
    def concurrency(cls, capacity: object, *, lease: object = 30.0, name: object = "") -> Limit:
        """At most ``capacity`` requests in flight; a slot not given back frees itself
        after ``lease`` seconds (a worker that died mid-request)."""
        return cls(Rate(capacity, lease), "concurrency",  # type: ignore[arg-type]
                   name=name or "concurrent")  # (Rate checks its own arguments)

    @classmethod
    def monthly(cls, amount: object, *, name: object = "") -> Limit:
        """``amount`` requests per UTC calendar month, reset on the 1st at 00:00."""
        return cls(Rate(amount, _MONTH), "calendar_month",  # type: ignore[arg-type]
                   name=name or "monthly")

    @property
    def period(self) -> float:
        """The window (or refill period) in seconds."""
        return self.rate.period

    def _default_name(self) -> str:
        unit = str(self.rate).split("/", 1)[1].replace(" ", "")
        return f"{self.rate.amount}-per-{unit}" if self.burst is None else (
            f"{self.rate.amount}-per-{unit}-burst-{self.burst}")

    def __str__(self) -> str:
        if self.is_concurrency:
            return f"concurrency {self.capacity} (lease {self.rate.period:g}s)"
        text = f"{self.algorithm} {self.rate}"
        if self.burst is not None:
            text += f" burst {self.burst}"
        if self.unit != "requests":
            text += f" ({self.unit})"
        if self.max_delay:
            text += f" held up to {self.max_delay:g}s"
        return text


MAX_DELAY = 3600.0
"""The longest a shaped limit may hold a request: an hour."""


def parse_delay(value: object) -> float:
    """Seconds from a number or a duration (``"5s"``, ``"500ms"``, ``"2m"``), from 0 to
    ``MAX_DELAY``, or a ConfigError naming the value."""
    seconds: float | None = None
    if isinstance(value, int | float) and not isinstance(value, bool):
        seconds = float(value)
    elif isinstance(value, str):
        text = value.strip().lower()
        for suffix, scale in (("ms", 0.001), ("s", 1.0), ("m", 60.0)):
            if text.endswith(suffix):
                number = text.removesuffix(suffix).strip()
                try:
                    seconds = float(number) * scale
                except ValueError:
                    seconds = None
                break
    if seconds is None or not 0 <= seconds <= MAX_DELAY:
        msg = (f"max_delay={value!r} is not a delay; expected seconds from 0 to "
               f"{MAX_DELAY:g}, or a duration such as '5s' or '500ms'")
        raise ConfigError(msg)
    return seconds


def _rebuild_limit(
    cls: type[Limit], rate: Rate, algorithm: str, burst: int | None, name: str,
    settlement: Settlement | None = None, unit: str = "requests", per: Partition | None = None,
    max_delay: float = 0.0,
) -> Limit:
    """Unpickle a limit (its constructor's arguments are keyword-only)."""
    return cls(rate, algorithm, burst=burst, name=name, unit=unit, settlement=settlement,
               per=per, max_delay=max_delay)


def as_limits(
    value: object, algorithm: object = "sliding_window", *, burst: object = None,
) -> tuple[Limit, ...]:
    """Limits from ``"10/minute; 1000/day"``, a Limit, or a sequence of both.

    ``algorithm`` and ``burst`` shape the limits given as rate strings (one limit per
    rate); a ``Limit`` carries its own.
    """
    if isinstance(value, Limit):
        if value.algorithm == "concurrency":
            msg = (f"{value} limits requests in flight: give the tier concurrency= "
                   f"(the lease is the concurrency_lease setting) instead of a limit")
            raise ConfigError(msg)
        return (value,)
    if isinstance(value, str):
        return tuple(Limit(rate, algorithm, burst=burst) for rate in split_rates(value))
    if isinstance(value, Iterable):
        out: list[Limit] = []
        for item in value:
            out.extend(as_limits(item, algorithm, burst=burst))
        return tuple(out)
    msg = f"expected limits as a rate string, a Limit or a list of them, got {value!r}"
    raise ConfigError(msg)


LimitKey = tuple[str, Limit]
"""What a decision is about: a hit's scope and its limit."""


def decide(state: Any, now: int, limit: Limit, cost: int) -> Step:
    """Run ``limit``'s algorithm on ``state`` at ``now`` (microseconds)."""
    return Step(*run(limit, state, now, cost))


def run(limit: Limit, state: Any, now: int, cost: int) -> RawStep:
    """``limit``'s algorithm on ``state`` at ``now``, as a plain tuple: the one place a
    step is dispatched. Named calls rather than a function kept in the registry:
    compiled, they pass the numbers and the answer without boxing them or building a
    tuple (a test checks each registered name reaches its module)."""
    kind = limit.algorithm
    amount, period, capacity = limit.amount, limit.period_us, limit.capacity
    if kind == "sliding_window":
        return sliding_window.decide(state, now, amount, period, capacity, cost)
    if kind == "token_bucket":
        return token_bucket.decide(state, now, amount, period, capacity, cost)
    if kind == "fixed_window":
        return fixed_window.decide(state, now, amount, period, capacity, cost)
    if kind == "concurrency":
        return concurrency.decide(state, now, amount, period, capacity, cost)
    if kind == "gcra":
        return gcra.decide(state, now, amount, period, capacity, cost, limit.max_delay_us)
    if kind == "sliding_log":
        return sliding_log.decide(state, now, amount, period, capacity, cost)
    return calendar_month.decide(state, now, amount, period, capacity, cost)


def settle(limit: Limit, state: Any, now: int, at: int, delta: int) -> Any:
    """``limit``'s state with ``delta`` more units charged (fewer, when negative) for a
    request decided at ``at``, settled at ``now`` (microseconds): see each algorithm's
    ``settle`` for how exact it is. A concurrency slot has nothing to settle."""
    kind = limit.algorithm
    if kind == "fixed_window":
        return fixed_window.settle(state, now, at, limit.period_us, delta)
    if kind == "sliding_window":
        return sliding_window.settle(state, now, at, limit.period_us, delta)
    if kind == "sliding_log":
        return sliding_log.settle(state, now, at, limit.period_us, delta)
    if kind == "token_bucket":
        return token_bucket.settle(state, now, limit.capacity, delta)
    if kind == "gcra":
        return gcra.settle(state, now, limit.amount, limit.period_us, limit.capacity, delta)
    if kind == "calendar_month":
        return calendar_month.settle(state, now, at, delta)
    return state

"""Charges the response decides: which responses count against a limit, and what a
request really cost, read once the response is known.

A limit that settles after the response (``Limit(..., count="failures")``,
``Limit(..., cost=cost_from_header("x-tokens-used"))``) is charged in two steps. Before
the app runs, its estimate is reserved in the same atomic call as every other limit of
the request, so concurrent requests can't overshoot it. When the response ends, the
reservation is settled by the difference: refunded when the response does not count,
raised to the real cost otherwise (past the limit, into debt).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Final

from .errors import ConfigError

__all__ = [
    "CostReader",
    "Count",
    "Settlement",
    "cost_from",
    "cost_from_header",
    "cost_from_state",
    "count_of",
]

MAX_UNITS = 1_000_000_000_000
"""The most a response may say it cost; more is read as this (a garbled header)."""


class Count:
    """Which responses count against a limit: ``all`` (the default), ``failures``
    (status 400 and above, or the statuses given), or ``successes`` (below 400)."""

    __slots__ = ("name", "statuses")

    def __init__(self, name: str, statuses: frozenset[int] = frozenset()) -> None:
        self.name: Final = name
        self.statuses: Final = statuses

    def counts(self, status: int) -> bool:
        """Whether a response of ``status`` counts."""
        if self.statuses:
            return status in self.statuses
        if self.name == "failures":
            return status >= 400
        if self.name == "successes":
            return status < 400
        return True

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, Count) and other.name == self.name
                and other.statuses == self.statuses)

    def __hash__(self) -> int:
        return hash((self.name, self.statuses))

    def __repr__(self) -> str:
        if self.statuses:
            return f"count={sorted(self.statuses)}"
        return f"count={self.name!r}"


ALL = Count("all")


def count_of(value: object) -> Count:
    """A ``Count`` from ``"all"``, ``"failures"``, ``"successes"`` or statuses (``[401,
    403]``, ``range(500, 600)``), or a ConfigError naming the bad value."""
    if isinstance(value, Count):
        return value
    if isinstance(value, str):
        name = value.strip().lower()
        if name in ("all", "failures", "successes"):
            return ALL if name == "all" else Count(name)
    elif isinstance(value, Iterable) and not isinstance(value, bytes | Mapping):
        statuses = list(value)
        if statuses and all(isinstance(s, int) and not isinstance(s, bool) and 100 <= s <= 599
                            for s in statuses):
            return Count("statuses", frozenset(statuses))
    msg = (f"count={value!r} is not a set of responses; expected 'all', 'failures' "
           f"(status >= 400), 'successes' (< 400) or statuses such as [401, 403]")
    raise ConfigError(msg)


class CostReader:
    """Reads what a request really cost once its response is known: from a response
    header, from ``scope["state"]`` (``request.state`` in Starlette), or from a function
    of the status and headers. Reading never raises: an answer that is missing or not a
    whole number >= 0 keeps the estimate."""

    __slots__ = ("function", "header", "remove", "state")

    def __init__(self, *, header: str = "", remove: bool = False, state: str = "",
                 function: Callable[[int, Mapping[str, str]], int | None] | None = None,
                 ) -> None:
        self.header: Final = header.lower()
        self.remove: Final = remove
        self.state: Final = state
        self.function: Final = function

    @property
    def header_bytes(self) -> bytes:
        """The header's name as ASGI writes it."""
        return self.header.encode("latin-1")

    def read(self, status: int, headers: Mapping[str, str], state: Any) -> int | None:
        """The cost the response reports, or None (keep the estimate)."""
        value: object
        if self.header:
            value = headers.get(self.header)
        elif self.state:
            value = state.get(self.state) if isinstance(state, Mapping) else None
        elif self.function is not None:
            try:
                value = self.function(status, headers)
            except Exception:  # the app's function: its failure keeps the estimate
                return None
        else:
            return None
        return _units(value)

    def __repr__(self) -> str:
        if self.header:
            return f"cost_from_header({self.header!r}, remove={self.remove})"
        if self.state:
            return f"cost_from_state({self.state!r})"
        return f"cost_from({self.function!r})"


def _units(value: object) -> int | None:
    """A whole number of units >= 0 from a header's text, a state's value or a
    function's answer; None for anything else."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return min(value, MAX_UNITS) if value >= 0 else None
    if isinstance(value, float):
        return min(int(value), MAX_UNITS) if 0 <= value < MAX_UNITS else None
    if isinstance(value, bytes):
        value = value.decode("latin-1")
    if isinstance(value, str):
        text = value.strip()
        if text.isdigit() and len(text) <= 13:  # no "+1", "1e3", nor other scripts' digits
            return min(int(text), MAX_UNITS) if text.isascii() else None
    return None


def cost_from_header(name: str, *, remove: bool = False) -> CostReader:
    """The real cost from the response header ``name`` (a whole number), which the app
    sets; ``remove=True`` takes it out of the response the client gets."""
    if not isinstance(name, str) or not name.strip() or not name.isascii():
        msg = f"cost_from_header needs a header name, got {name!r}"
        raise ConfigError(msg)
    return CostReader(header=name.strip(), remove=bool(remove))


def cost_from_state(key: str) -> CostReader:
    """The real cost from ``scope["state"][key]``: ``request.state.<key> = n`` in a
    Starlette or FastAPI handler (a stream sets it before its last chunk)."""
    if not isinstance(key, str) or not key.isidentifier():
        msg = f"cost_from_state needs an attribute name, got {key!r}"
        raise ConfigError(msg)
    return CostReader(state=key)


def cost_from(function: Callable[[int, Mapping[str, str]], int | None]) -> CostReader:
    """The real cost from ``function(status, headers)`` (headers lower-cased), called
    once the response has started; None (or a failure) keeps the estimate."""
    if not callable(function) or inspect.iscoroutinefunction(function):
        msg = f"cost_from needs a plain function of (status, headers), got {function!r}"
        raise ConfigError(msg)
    return CostReader(function=function)


class Settlement:
    """How a limit's charge is settled after the response: which responses ``count``,
    where the real ``cost`` is read (None: the reserved estimate is the cost), and the
    ``estimate`` reserved before the app runs (None: the request's cost)."""

    __slots__ = ("cost", "count", "estimate", "reads_headers")

    def __init__(self, count: Count, cost: CostReader | None, estimate: int | None) -> None:
        self.count: Final = count
        self.cost: Final = cost
        self.estimate: Final = estimate
        self.reads_headers: Final = cost is not None and not cost.state
        """True when the cost is read as the response starts (a header, a function)."""

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, Settlement) and other.count == self.count
                and other.cost is self.cost and other.estimate == self.estimate)

    def __hash__(self) -> int:
        return hash((self.count, id(self.cost), self.estimate))

    def __repr__(self) -> str:
        parts = [repr(self.count)]
        if self.cost is not None:
            parts.append(f"cost={self.cost!r}")
        if self.estimate is not None:
            parts.append(f"estimate={self.estimate}")
        return f"Settlement({', '.join(parts)})"


def settlement_of(count: object, cost: object, estimate: object) -> Settlement | None:
    """The settlement a limit's ``count``, ``cost`` and ``estimate`` ask for, or None
    when the charge is decided before the app runs, as usual."""
    counted = count_of("all" if count is None else count)
    if cost is not None and not isinstance(cost, CostReader):
        msg = (f"cost={cost!r} is not where a real cost is read; use cost_from_header(...), "
               f"cost_from_state(...) or cost_from(function)")
        raise ConfigError(msg)
    if estimate is not None and (isinstance(estimate, bool) or not isinstance(estimate, int)
                                 or estimate < 0):
        msg = f"estimate must be a whole number of units >= 0, got {estimate!r}"
        raise ConfigError(msg)
    if estimate is not None and cost is None:
        msg = (f"estimate={estimate} needs cost=...: the real cost read after the response "
               f"is what the estimate stands in for")
        raise ConfigError(msg)
    if counted is ALL and cost is None:
        return None
    return Settlement(counted, cost, estimate)

"""How a user marks routes: the ``@limit`` decorator (also a FastAPI dependency),
``@exempt``, ``@cost``, path patterns from configuration (``RouteRule``), and the
``RouteSpec`` the middleware makes of them for each route.

``route_table`` finds a request's route among the app's routes and reads these marks.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from .checks import is_token
from .errors import ConfigError
from .hits import Hit
from .limits import Limit, as_limits

__all__ = ["RouteLimit", "RouteRule", "RouteSpec", "cost", "exempt", "limit", "spends"]

F = TypeVar("F", bound=Callable[..., Any])
_log = logging.getLogger("ratelimit_mw")
_LIMITS = "__ratelimit_limits__"
_EXEMPT = "__ratelimit_exempt__"
_COST = "__ratelimit_cost__"
_SPENDS = "__ratelimit_spends__"


def _check_cost(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        msg = f"a route's cost must be a positive integer, got {value!r}"
        raise ConfigError(msg)
    return value


async def _as_dependency() -> None:
    """What FastAPI sees of a ``RouteLimit`` used in ``Depends``: an async no-op."""


class RouteLimit:
    """Limits of one endpoint, added to the tier's; each request costs ``cost`` on them.

    Use it as a decorator (``@limit("5/minute")`` under ``@app.get(...)`` or on a
    Starlette endpoint) or as a FastAPI dependency
    (``dependencies=[Depends(limit("5/minute"))]``). Either way it only marks the
    route: the middleware enforces it, together with the tier's limits, in one call.
    """

    __slots__ = ("cost", "limits", "shadow")
    # FastAPI follows __wrapped__ to learn a dependency's signature and whether to await
    # it: an async function of no parameters, so it is awaited on the event loop.
    __wrapped__ = staticmethod(_as_dependency)

    def __init__(self, limits: tuple[Limit, ...], cost: int = 1, shadow: bool = False) -> None:
        if not limits:
            msg = "@limit needs at least one rate, e.g. @limit('5/minute')"
            raise ConfigError(msg)
        self.limits = limits
        self.cost = _check_cost(cost)
        self.shadow = bool(shadow)

    def __call__(self, endpoint: F | None = None) -> Any:
        if endpoint is None:
            return _as_dependency()
        marks = getattr(endpoint, _LIMITS, ())
        try:
            setattr(endpoint, _LIMITS, (*marks, self))
        except (AttributeError, TypeError) as exc:
            msg = f"@limit can't mark {endpoint!r}; decorate a function or a method"
            raise ConfigError(msg) from exc
        return endpoint

    def __repr__(self) -> str:
        rates = "; ".join(str(limit) for limit in self.limits)
        return f"limit({rates!r}, cost={self.cost}, shadow={self.shadow})"


def limit(
    rates: str | Limit | Sequence[Limit | str], algorithm: str | None = None, *,
    burst: int | None = None, name: str = "", cost: int = 1, shadow: bool = False,
) -> RouteLimit:
    """Limit an endpoint: ``@limit("5/minute")``, ``@limit("10/second", "token_bucket",
    burst=20)``; ``shadow=True`` reports without blocking. ``algorithm``, ``burst`` and
    ``name`` shape limits given as a rate; ``Limit`` objects carry their own."""
    if isinstance(rates, str):
        limits = as_limits(rates, algorithm or "sliding_window", burst=burst)
        if name:
            limits = tuple(
                Limit(lim.rate, lim.algorithm, burst=lim.burst,
                      name=name if len(limits) == 1 else f"{name}-{i}")
                for i, lim in enumerate(limits, 1))
    else:
        if algorithm is not None or burst is not None or name:
            msg = (f"limit({rates!r}, ...): algorithm, burst and name apply to a rate such "
                   f"as '10/minute'; a Limit carries its own")
            raise ConfigError(msg)
        limits = as_limits(rates)
    return RouteLimit(limits, cost, shadow)


def exempt(endpoint: F) -> F:
    """Mark an endpoint as not rate limited at all."""
    setattr(endpoint, _EXEMPT, True)
    return endpoint


def cost(amount: int) -> Callable[[F], F]:
    """Make each request to the endpoint count ``amount`` against the tier's limits."""
    amount = _check_cost(amount)

    def mark(endpoint: F) -> F:
        setattr(endpoint, _COST, amount)
        return endpoint

    return mark


def spends(unit: str, estimate: int) -> Callable[[F], F]:
    """Make the endpoint spend ``unit`` (``"tokens"``): the tier's limits counting that
    unit apply to its requests, each reserving ``estimate`` until the response settles
    what it cost. Elsewhere those limits are not charged at all."""
    if not isinstance(unit, str) or not is_token(unit) or unit != unit.lower():
        msg = f"spends needs a unit such as 'tokens', got {unit!r}"
        raise ConfigError(msg)
    if unit == "requests":
        msg = "every endpoint spends requests; set what one costs with @cost(n)"
        raise ConfigError(msg)
    if isinstance(estimate, bool) or not isinstance(estimate, int) or estimate < 0:
        msg = f"spends({unit!r}, ...) needs an estimate: a whole number >= 0, got {estimate!r}"
        raise ConfigError(msg)

    def mark(endpoint: F) -> F:
        setattr(endpoint, _SPENDS, {**getattr(endpoint, _SPENDS, {}), unit: estimate})
        return endpoint

    return mark


def spends_on(target: object) -> dict[str, int]:
    """The units ``@spends`` marks on a function or class, with their estimates."""
    return dict(getattr(target, _SPENDS, {}))


def marks_on(target: object) -> tuple[tuple[RouteLimit, ...], bool, int | None]:
    """The ``@limit`` marks, ``@exempt`` and ``@cost`` (None: unset) on a function or class."""
    return (getattr(target, _LIMITS, ()), bool(getattr(target, _EXEMPT, False)),
            getattr(target, _COST, None))


_KNOWN_METHODS = frozenset((
    "GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "TRACE", "CONNECT", "QUERY",
    "PROPFIND", "PROPPATCH", "MKCOL", "COPY", "MOVE", "LOCK", "UNLOCK", "REPORT", "SEARCH"))


@dataclass(frozen=True, slots=True)
class RouteRule:
    """Limits for paths that match ``path`` (``*``: anything, ``{name}``: one segment),
    for ``methods`` (all when empty), from configuration instead of a decorator.

    ``limits`` are the rule's own, shared by every path it matches, and each request
    counts 1 on them; ``cost`` is what each request counts against the tier's limits
    (as ``@cost`` does). ``exempt`` takes the paths out of rate limiting; ``shadow``
    makes the rule's limits report without blocking.
    """

    path: str
    methods: frozenset[str] = frozenset()
    limits: Sequence[Limit] | str = ()
    cost: int = 1
    exempt: bool = False
    shadow: bool = False
    pattern: re.Pattern[str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.path, str) or not self.path.startswith("/"):
            msg = f"a route pattern must start with '/', got {self.path!r}"
            raise ConfigError(msg)
        if any(char.isspace() for char in self.path):
            msg = (f"a route pattern can't hold white space, got {self.path!r} "
                   f"(give several paths as a list)")
            raise ConfigError(msg)
        methods = [self.methods] if isinstance(self.methods, str) else self.methods
        names = frozenset(m.strip().upper() if isinstance(m, str) else m for m in methods)
        for name in names:
            if not isinstance(name, str) or not is_token(name):
                msg = f"route {self.path!r}: {name!r} is not an HTTP method (e.g. 'GET')"
                raise ConfigError(msg)
            if name not in _KNOWN_METHODS:
                _log.warning("ratelimit_mw: route %r: %r is no method HTTP or WebDAV defines "
                             "(a typo?); the rule applies only to requests of that method",
                             self.path, name)
        object.__setattr__(self, "methods", names)
        object.__setattr__(self, "limits", as_limits(self.limits))
        object.__setattr__(self, "cost", _check_cost(self.cost))
        object.__setattr__(self, "pattern", compile_pattern(self.path))

    @property
    def scope(self) -> str:
        """The counters of a rule are shared by every path it matches."""
        return f"rule:{','.join(sorted(self.methods)) or '*'} {self.path}"

    def matches(self, method: str, path: str) -> bool:
        """True when this rule applies to ``method`` and ``path`` (a rule for GET also
        covers HEAD, which Starlette answers with the GET endpoint)."""
        methods = self.methods
        return (not methods or method in methods or (method == "HEAD" and "GET" in methods)
                ) and bool(self.pattern.fullmatch(path))


def compile_pattern(path: str) -> re.Pattern[str]:
    """``/users/{id}/*`` -> a regex: ``{name}`` one path segment, ``*`` and
    ``{name:path}`` (Starlette's convertor) anything.

    A path holds whatever the client percent-encoded, line feeds included: ``*`` matches
    them, and a path may end in one, because Starlette's ``^...$`` routes ``/reports%0A``
    to the ``/reports`` endpoint, and the rule's limits must apply to it too."""
    out = []
    for token in re.split(r"(\{[^}/]*\}|\*)", path):
        if token == "*" or (token.startswith("{") and token.endswith(":path}")):
            out.append(".*")
        elif token.startswith("{") and token.endswith("}"):
            out.append("[^/]+")
        else:
            out.append(re.escape(token))
    return re.compile("".join(out) + "\n?", re.DOTALL)


@dataclass(frozen=True, slots=True, eq=False)
class RouteSpec:
    """Everything the middleware needs to know about one route (hashed by identity)."""

    label: str = ""
    exempt: bool = False
    cost: int = 1
    hits: tuple[Hit, ...] = ()
    shadow: tuple[Hit, ...] = ()
    spends: tuple[tuple[str, int], ...] = ()
    """The units beside requests its requests spend (``@spends``), with their estimates."""


NO_ROUTE = RouteSpec()
EXEMPT = RouteSpec(exempt=True)

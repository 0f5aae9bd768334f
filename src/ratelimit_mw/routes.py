"""Per-route limits: the ``@limit`` decorator (also a FastAPI dependency), ``@exempt``,
``@cost``, and path patterns from configuration.

The middleware runs before routing, so it finds a request's endpoint by matching the
scope against the app's routes itself, once per method and path, and keeps the answer
in a bounded cache.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from starlette.routing import Match
from starlette.types import ASGIApp, Scope

from .errors import ConfigError
from .keys import is_token
from .policy import Hit, Limit, limits_from
from .tiers import as_limits

__all__ = ["RouteLimit", "RouteRule", "RouteSpec", "RouteTable", "cost", "exempt", "limit"]

F = TypeVar("F", bound=Callable[..., Any])
_LIMITS = "__ratelimit_limits__"
_EXEMPT = "__ratelimit_exempt__"
_COST = "__ratelimit_cost__"


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
    rates: str | Limit | Sequence[Limit | str], algorithm: str = "sliding_window", *,
    burst: int | None = None, name: str = "", cost: int = 1, shadow: bool = False,
) -> RouteLimit:
    """Limit an endpoint: ``@limit("5/minute")``, ``@limit("10/second", "token_bucket",
    burst=20)``; ``shadow=True`` reports without blocking."""
    if isinstance(rates, str):
        limits = tuple(limits_from(rates, algorithm, burst=burst))
        if name:
            limits = tuple(
                Limit(lim.rate, lim.algorithm, lim.burst, name if len(limits) == 1 else
                      f"{name}-{i}") for i, lim in enumerate(limits, 1))
    else:
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
        methods = [self.methods] if isinstance(self.methods, str) else self.methods
        names = frozenset(m.strip().upper() if isinstance(m, str) else m for m in methods)
        for name in names:
            if not isinstance(name, str) or not is_token(name):
                msg = f"route {self.path!r}: {name!r} is not an HTTP method (e.g. 'GET')"
                raise ConfigError(msg)
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
    """``/users/{id}/*`` -> a regex: ``{name}`` one path segment, ``*`` anything."""
    out = []
    for token in re.split(r"(\{[^}/]*\}|\*)", path):
        if token == "*":
            out.append(".*")
        elif token.startswith("{") and token.endswith("}"):
            out.append("[^/]+")
        else:
            out.append(re.escape(token))
    return re.compile("".join(out))


@dataclass(frozen=True, slots=True, eq=False)
class RouteSpec:
    """Everything the middleware needs to know about one route (hashed by identity)."""

    label: str = ""
    exempt: bool = False
    cost: int = 1
    hits: tuple[Hit, ...] = ()
    shadow: tuple[Hit, ...] = ()

    @property
    def limited(self) -> bool:
        return bool(self.hits) or self.cost != 1


NO_ROUTE = RouteSpec()
EXEMPT = RouteSpec(exempt=True)


def _spec(label: str, marks: Iterable[RouteLimit], rules: Iterable[RouteRule],
          is_exempt: bool, route_cost: int | None) -> RouteSpec:
    """Fold decorator marks and matching rules into one spec."""
    hits: list[Hit] = []
    shadow: list[Hit] = []
    costs = [route_cost] if route_cost is not None else []
    for mark in marks:
        for lim in mark.limits:
            hit = Hit(lim, mark.cost, label)
            hits.append(hit)
            if mark.shadow:
                shadow.append(hit)
    for rule in rules:
        is_exempt = is_exempt or rule.exempt
        if rule.cost != 1:
            costs.append(rule.cost)
        for rule_limit in rule.limits:
            hit = Hit(rule_limit, 1, rule.scope)
            hits.append(hit)
            if rule.shadow:
                shadow.append(hit)
    if is_exempt:
        return EXEMPT
    if not hits and not costs:
        return NO_ROUTE
    return RouteSpec(label, False, max(costs, default=1), tuple(hits), tuple(shadow))


def _endpoint_marks(route: Any, method: str) -> tuple[list[RouteLimit], bool, int | None]:
    """The ``@limit`` marks, exemption and cost set on a route's endpoint or dependencies."""
    endpoint = getattr(route, "endpoint", None)
    targets = [endpoint]
    handler = getattr(endpoint, method.lower(), None) if isinstance(endpoint, type) else None
    if handler is not None:
        targets.append(handler)  # a method of an HTTPEndpoint class
    marks: list[RouteLimit] = []
    is_exempt = False
    route_cost = None
    for target in targets:
        marks.extend(getattr(target, _LIMITS, ()))
        is_exempt = is_exempt or bool(getattr(target, _EXEMPT, False))
        route_cost = getattr(target, _COST, route_cost)
    marks.extend(_dependency_marks(getattr(route, "dependant", None)))
    return marks, is_exempt, route_cost


def _dependency_marks(dependant: Any, depth: int = 0) -> Iterator[RouteLimit]:
    """``RouteLimit`` objects used as FastAPI dependencies, at any depth."""
    if dependant is None or depth > 20:
        return
    for sub in getattr(dependant, "dependencies", ()):
        if isinstance(sub.call, RouteLimit):
            yield sub.call
        yield from _dependency_marks(sub, depth + 1)


def find_router(app: Any) -> Any:
    """The router under a stack of middleware (``.app`` links), or None."""
    for _ in range(50):
        if app is None:
            return None
        if hasattr(app, "routes"):
            return app
        app = getattr(app, "app", None)
    return None


def walk_routes(
    routes: Iterable[Any], prefix: str = "", depth: int = 0,
) -> Iterator[tuple[str, Any]]:
    """Every leaf route with its full path, through mounts."""
    for route in routes:
        path = prefix + getattr(route, "path", "")
        children = getattr(route, "routes", None)
        if children is not None and depth < 10:
            yield from walk_routes(children, path, depth + 1)
        else:
            yield path, route


class RouteTable:
    """Resolves a request to its ``RouteSpec``: app routes, configured rules, exempt paths."""

    __slots__ = ("_router", "cache", "cache_size", "exempt_rules", "rules")

    def __init__(self, app: ASGIApp | None, rules: Sequence[RouteRule] = (),
                 exempt_paths: Iterable[str] = (), *, cache_size: int = 4096) -> None:
        self.rules = tuple(rules)
        self.exempt_rules = tuple(RouteRule(p, exempt=True) for p in exempt_paths)
        self.cache_size = cache_size
        self._router = find_router(app)
        self.cache: dict[tuple[str, str], RouteSpec] = {}
        """(method, path) → spec, for the paths seen (the oldest dropped when full)."""

    def known_specs(self) -> Iterator[RouteSpec]:
        """The specs of every route the app declares and every rule (start-up checks)."""
        for rule in self.rules:
            yield _spec(f"{rule.path}", (), (rule,), False, None)
        if self._router is None:
            return
        for path, route in walk_routes(self._router.routes):
            for method in sorted(getattr(route, "methods", None) or {"GET"}):
                marks, is_exempt, route_cost = _endpoint_marks(route, method)
                yield _spec(path, marks, (), is_exempt, route_cost)

    def resolve(self, scope: Scope) -> RouteSpec:
        """The spec of this request's route (cached per method and path)."""
        slot = (scope["method"], scope["path"])
        spec = self.cache.get(slot)
        if spec is None:
            spec = self._resolve(scope, *slot)
            cache = self.cache
            if len(cache) >= self.cache_size:
                del cache[next(iter(cache))]
            cache[slot] = spec
        return spec

    def _resolve(self, scope: Scope, method: str, path: str) -> RouteSpec:
        if any(rule.matches(method, path) for rule in self.exempt_rules):
            return EXEMPT
        rules = [rule for rule in self.rules if rule.matches(method, path)]
        router = self._router if self._router is not None else find_router(scope.get("app"))
        found = _match(router.routes, scope, "") if router is not None else None
        if found is None:
            return _spec(path, (), rules, False, None) if rules else NO_ROUTE
        label, route = found
        marks, is_exempt, route_cost = _endpoint_marks(route, method)
        return _spec(label, marks, rules, is_exempt, route_cost)


def _match(
    routes: Iterable[Any], scope: Scope, prefix: str, depth: int = 0,
) -> tuple[str, Any] | None:
    """The route that would handle ``scope`` (a method mismatch counts if nothing else fits)."""
    partial = None
    for route in routes:
        try:
            match, child = route.matches(scope)
        except Exception:  # a custom route that can't match this scope is not a 500
            continue
        if match is Match.NONE:
            continue
        path = prefix + getattr(route, "path", "")
        children = getattr(route, "routes", None)
        if children is not None and depth < 10:
            if match is Match.FULL:
                found = _match(children, {**scope, **child}, path, depth + 1)
                if found is not None:
                    return found
            continue
        if match is Match.FULL:
            return path, route
        if partial is None:
            partial = (path, route)
    return partial

"""Per-route limits: the ``@limit`` decorator (also a FastAPI dependency), ``@exempt``,
``@cost``, and path patterns from configuration.

The middleware runs before routing, so it finds a request's endpoint by matching the
scope against the app's routes itself, once per method and path, and keeps the answer
in a bounded cache.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from starlette.routing import Match, compile_path
from starlette.types import ASGIApp, Scope

from .errors import ConfigError
from .keys import is_token
from .policy import Hit, Limit, limits_from
from .tiers import as_limits

__all__ = ["RouteLimit", "RouteRule", "RouteSpec", "RouteTable", "cost", "exempt", "limit"]

F = TypeVar("F", bound=Callable[..., Any])
_log = logging.getLogger("ratelimit_mw")
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
    rates: str | Limit | Sequence[Limit | str], algorithm: str | None = None, *,
    burst: int | None = None, name: str = "", cost: int = 1, shadow: bool = False,
) -> RouteLimit:
    """Limit an endpoint: ``@limit("5/minute")``, ``@limit("10/second", "token_bucket",
    burst=20)``; ``shadow=True`` reports without blocking. ``algorithm``, ``burst`` and
    ``name`` shape limits given as a rate; ``Limit`` objects carry their own."""
    if isinstance(rates, str):
        limits = tuple(limits_from(rates, algorithm or "sliding_window", burst=burst))
        if name:
            limits = tuple(
                Limit(lim.rate, lim.algorithm, lim.burst, name if len(limits) == 1 else
                      f"{name}-{i}") for i, lim in enumerate(limits, 1))
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
    them, and a path may end in one, as Starlette's ``^...$`` routes it to the endpoint
    (else ``/reports%0A`` ran the endpoint past the rule's limits)."""
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

    @property
    def limited(self) -> bool:
        return bool(self.hits) or self.cost != 1


NO_ROUTE = RouteSpec()
EXEMPT = RouteSpec(exempt=True)


def _spec(label: str, marks: Iterable[RouteLimit], rules: Iterable[RouteRule],
          is_exempt: bool, route_cost: int | None, methods: str = "") -> RouteSpec:
    """Fold decorator marks and matching rules into one spec. The counters of a mark
    are the endpoint's own: its path and ``methods`` (``GET,HEAD``), so that a GET and
    a POST endpoint at one path, marked alike, do not count on one counter."""
    hits: list[Hit] = []
    shadow: list[Hit] = []
    costs = [route_cost] if route_cost is not None else []
    scope = f"{methods} {label}" if methods else label
    for mark in marks:
        for lim in mark.limits:
            hit = Hit(lim, mark.cost, scope)
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


_HTTP_METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "TRACE")


def _handler(endpoint: Any, method: str) -> Any:
    """The method of an ``HTTPEndpoint`` class that answers ``method`` (HEAD: ``get``,
    unless it has a ``head``, as Starlette does), or None."""
    if not isinstance(endpoint, type):
        return None
    handler = getattr(endpoint, method.lower(), None)
    if handler is None and method == "HEAD":
        handler = getattr(endpoint, "get", None)
    return handler


def _methods(route: Any, method: str) -> str:
    """The methods a route's own counters belong to: the route's, or for an endpoint
    class (which declares none) the one its handler answers (HEAD: GET's, unless the
    class has a ``head``)."""
    methods = getattr(route, "methods", None)
    if methods:
        return ",".join(sorted(methods))
    endpoint = getattr(route, "endpoint", None)
    if method == "HEAD" and getattr(endpoint, "head", None) is None:
        return "GET"
    return method


def _route_methods(route: Any) -> list[str]:
    """The methods a route answers, for the start-up checks."""
    methods = getattr(route, "methods", None)
    if methods:
        return sorted(methods)
    endpoint = getattr(route, "endpoint", None)
    if isinstance(endpoint, type):
        return [m for m in _HTTP_METHODS if getattr(endpoint, m.lower(), None) is not None]
    return ["GET"]


def _endpoint_marks(route: Any, method: str) -> tuple[list[RouteLimit], bool, int | None]:
    """The ``@limit`` marks, exemption and cost set on a route's endpoint or dependencies."""
    endpoint = getattr(route, "endpoint", None)
    targets = [endpoint]
    handler = _handler(endpoint, method)
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


def _segment(route: Any) -> str:
    """What a route adds to its children's labels: its path, or for a ``Host`` route
    its host (``//api.example.com``), so that hosts keep counters of their own."""
    path = getattr(route, "path", None)
    if isinstance(path, str):
        return path
    host = getattr(route, "host", None)
    return f"//{host}" if isinstance(host, str) else ""


def _children(route: Any) -> list[Any] | None:
    """The routes under a mount, a host or a router FastAPI includes (newer FastAPI
    keeps an included router as one route: its routes, prefixed, are its effective
    route contexts, each matched and marked like a route); None for a leaf."""
    contexts = getattr(route, "effective_route_contexts", None)
    if callable(contexts):
        return [getattr(c, "starlette_route", None) or c for c in contexts()]
    children = getattr(route, "routes", None)
    return list(children) if children is not None else None


def walk_routes(
    routes: Iterable[Any], prefix: str = "", depth: int = 0,
) -> Iterator[tuple[str, Any]]:
    """Every leaf route with its full path, through mounts, hosts and included routers."""
    for route in routes:
        path = prefix + _segment(route)
        children = _children(route)
        if children is not None and depth < 10:
            yield from walk_routes(children, path, depth + 1)
        else:
            yield path, route


def has_hosts(routes: Iterable[Any], depth: int = 0) -> bool:
    """True when some route is matched on the Host header."""
    for route in routes:
        if isinstance(getattr(route, "host", None), str):
            return True
        children = _children(route)
        if children is not None and depth < 10 and has_hosts(children, depth + 1):
            return True
    return False


def route_path(scope: Scope) -> str:
    """The path the app routes on: ``scope["path"]`` without the ``root_path`` that a
    server (``--root-path``) or a mount puts in front of it, as Starlette routes."""
    path: str = scope["path"]
    root = scope.get("root_path", "")
    if root and path.startswith(root) and path[len(root):len(root) + 1] in ("", "/"):
        return path[len(root):] or "/"
    return path


class RouteTable:
    """Resolves a request to its ``RouteSpec``: app routes, configured rules, exempt paths."""

    __slots__ = ("_hosts", "_router", "cache", "cache_size", "exempt_rules", "rules", "seen")

    def __init__(self, app: ASGIApp | None, rules: Sequence[RouteRule] = (),
                 exempt_paths: Iterable[str] = (), *, cache_size: int = 4096) -> None:
        self.rules = tuple(rules)
        self.exempt_rules = tuple(RouteRule(p, exempt=True) for p in exempt_paths)
        self.cache_size = cache_size
        self._router = find_router(app)
        self._hosts = self._router is not None and has_hosts(self._router.routes)
        self.seen: dict[tuple[str, ...], RouteSpec] = {}
        """(method, path) → spec (with the Host header too when the app routes on it),
        for the requests seen (the oldest dropped when full)."""
        self.cache: dict[tuple[str, ...], RouteSpec] = {} if self._hosts else self.seen
        """What may be looked up by (method, path) alone: ``seen``, unless the app routes
        on the Host header (then always empty)."""

    def known_specs(self) -> Iterator[RouteSpec]:
        """The specs of every route the app declares and every rule (start-up checks)."""
        for rule in self.rules:
            yield _spec(f"{rule.path}", (), (rule,), False, None)
        if self._router is None:
            return
        for path, route in walk_routes(self._router.routes):
            for method in _route_methods(route):
                marks, is_exempt, route_cost = _endpoint_marks(route, method)
                yield _spec(path, marks, (), is_exempt, route_cost, _methods(route, method))

    def unreachable(self) -> list[str]:
        """The rules' and exempt paths' patterns that no route of the app can match (a
        typo, a trailing slash the routes don't have): named in a start-up warning.
        Lenient where it can't tell: a pattern is only named when it surely misses."""
        rules = (*self.rules, *self.exempt_rules)
        router = self._router
        # Routes it can't see (FastAPI's frontend routes), or a default app that answers
        # what no route does: no judging.
        if router is None or not rules or _has_frontend(router) or _answers_anything(router):
            return []
        shapes: list[_Shape] = []
        for path, below in _shapes(router.routes):
            if below is None:
                return []
            shapes.append(_Shape(path, below))
        if not shapes:
            return []
        return [rule.path for rule in rules if not any(shape.could_match(rule)
                                                        for shape in shapes)]

    def resolve(self, scope: Scope) -> RouteSpec:
        """The spec of this request's route (cached per method and path)."""
        slot: tuple[str, ...] = (scope["method"], scope["path"])
        if self._hosts:
            slot = (*slot, _host(scope))
        spec = self.seen.get(slot)
        if spec is None:
            spec = self._resolve(scope, scope["method"], route_path(scope))
            seen = self.seen
            if len(seen) >= self.cache_size:
                del seen[next(iter(seen))]
            seen[slot] = spec
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
        return _spec(label, marks, rules, is_exempt, route_cost, _methods(route, method))


def _segments_fit(rule: str, route: str) -> bool:
    """Whether a path could match both patterns, segment by segment: equal, or a
    parameter on either side (and anything where either spans segments)."""
    if "*" in rule or ":path}" in route:
        return True
    left, right = rule.split("/"), route.split("/")
    return len(left) == len(right) and all(
        a == b or "{" in a or "{" in b for a, b in zip(left, right, strict=True))


def _has_frontend(router: Any) -> bool:
    """True when FastAPI keeps frontend routes on ``router``, apart from its routes."""
    return bool(getattr(router, "_low_priority_routes", None))


def _answers_anything(router: Any) -> bool:
    """True when the router's ``default`` is an app of its own, not Starlette's 404."""
    default = getattr(router, "default", None)
    own = getattr(type(router), "not_found", None)
    return default is not None and getattr(default, "__func__", None) is not own


def _shapes(routes: Iterable[Any], prefix: str = "", depth: int = 0,
            ) -> Iterator[tuple[str, bool | None]]:
    """``(path template, below)`` of every route; ``below``: a mount of an app that has
    no routes of its own, which answers any path below it; None: a router with routes
    it keeps apart (FastAPI's low-priority frontend routes)."""
    for route in routes:
        if _has_frontend(route) or _has_frontend(getattr(route, "original_router", None)):
            yield prefix, None
        own = getattr(route, "path", "")
        path = prefix + (own if isinstance(own, str) else "")
        children = _children(route)
        inner = find_router(getattr(route, "app", None))
        if children and depth < 10 and not (inner is not None and _answers_anything(inner)):
            yield from _shapes(children, path, depth + 1)
        else:
            # A leaf, or a mount that answers any path below it: of an app without
            # routes, or of a router with a default app of its own.
            yield path, children is not None


_PARAM = re.compile(r"\{[^}]*\}|\*")


class _Shape:
    """A route's path template, made ready to be compared with rule patterns."""

    __slots__ = ("below", "literal", "path", "regex", "sample")

    def __init__(self, path: str, below: bool) -> None:
        self.path = path
        self.below = below
        self.sample = _PARAM.sub("x", path)  # a path the route matches
        self.literal = _PARAM.split(path, 1)[0]  # the start every path it matches has
        try:
            self.regex: re.Pattern[str] | None = compile_path(path)[0]
        except (AssertionError, ValueError):  # not a path Starlette would take
            self.regex = None

    def could_match(self, rule: RouteRule) -> bool:
        """Whether some request could match both ``rule`` and this route."""
        literal = _PARAM.split(rule.path, 1)[0]
        if not (literal.startswith(self.literal) or self.literal.startswith(literal)):
            return False  # the fixed starts differ
        sample = _PARAM.sub("x", rule.path)  # a path the rule matches
        if self.below:
            root = self.path.rstrip("/")
            return sample == root or sample.startswith(root + "/") or bool(
                rule.pattern.fullmatch(root + "/x"))
        if self.regex is None or rule.pattern.fullmatch(self.sample) or self.regex.match(sample):
            return True
        # Both have parameters: a literal of one may fit a parameter of the other.
        return _segments_fit(rule.path, self.path)


def _host(scope: Scope) -> str:
    for name, value in scope.get("headers", ()):
        if name == b"host":
            return str(value, "latin-1")
    return ""


def _match(
    routes: Iterable[Any], scope: Scope, prefix: str, depth: int = 0,
) -> tuple[str, Any] | None:
    """The route that will handle ``scope``, or None. Only a full match counts: for a
    method the route does not take (a CORS preflight, a 405) its endpoint never runs,
    so its own limits are not charged."""
    for route in routes:
        try:
            match, child = route.matches(scope)
        except Exception:  # a custom route that can't match this scope is not a 500
            continue
        if match is not Match.FULL:
            continue
        path = prefix + _segment(route)
        children = _children(route)
        if children is None or depth >= 10:
            return path, route
        found = _match(children, {**scope, **child}, path, depth + 1)
        if found is not None:
            return found
    return None

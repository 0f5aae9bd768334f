"""Finding a request's route and its ``RouteSpec``: the app's routes, with the marks on
their endpoints, and the rules and exempt paths from configuration.

The middleware runs before routing, so it finds a request's endpoint by matching the
scope against the app's routes itself, once per method and path, and keeps the answer
in a bounded cache.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from starlette.types import ASGIApp, Scope

from .app_routes import find_router, has_hosts, match_route, unreachable_patterns, walk_routes
from .hits import Hit
from .routes import EXEMPT, NO_ROUTE, RouteLimit, RouteRule, RouteSpec, marks_on, spends_on

__all__ = ["RouteTable", "dependency_calls"]


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
            yield _spec(rule.path, (), (rule,), False, None)
        if self._router is None:
            return
        for path, route in walk_routes(self._router.routes):
            for method in _route_methods(route):
                marks, is_exempt, route_cost = _endpoint_marks(route, method)
                yield _spec(path, marks, (), is_exempt, route_cost, _methods(route, method),
                            _endpoint_spends(route, method))

    def declared(self) -> Iterator[tuple[str, str, Any, RouteSpec]]:
        """``(method, path, route, spec)`` of every route the app declares, the spec as
        a request to it resolves (its marks, the rules and exempt paths its path
        template matches): what the OpenAPI document describes."""
        if self._router is None:
            return
        for path, route in walk_routes(self._router.routes):
            for method in _route_methods(route):
                yield method, path, route, self._spec_of(route, method, path, path)

    def unreachable(self) -> list[str]:
        """The rules' and exempt paths' patterns that no route of the app can match (a
        typo, a trailing slash the routes don't have): named in a start-up warning.
        Lenient where it can't tell: a pattern is only named when it surely misses."""
        return unreachable_patterns((*self.rules, *self.exempt_rules), self._router)

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
        router = self._router if self._router is not None else find_router(scope.get("app"))
        found = match_route(router.routes, scope, "") if router is not None else None
        if found is None:
            return self._spec_of(None, method, path, path)
        label, route = found
        return self._spec_of(route, method, label, path)

    def _spec_of(self, route: Any, method: str, label: str, path: str) -> RouteSpec:
        """The spec of ``route`` (None: no route of the app) answering ``method``, for a
        request path ``path``."""
        if any(rule.matches(method, path) for rule in self.exempt_rules):
            return EXEMPT
        rules = [rule for rule in self.rules if rule.matches(method, path)]
        if route is None:
            # Labelled by the pattern, not the path: labels stay few (metrics, logs).
            return _spec(rules[0].path, (), rules, False, None) if rules else NO_ROUTE
        marks, is_exempt, route_cost = _endpoint_marks(route, method)
        return _spec(label, marks, rules, is_exempt, route_cost, _methods(route, method),
                     _endpoint_spends(route, method))


def route_path(scope: Scope) -> str:
    """The path the app routes on: ``scope["path"]`` without the ``root_path`` that a
    server (``--root-path``) or a mount puts in front of it, as Starlette routes."""
    path: str = scope["path"]
    root = scope.get("root_path", "")
    if root and path.startswith(root) and path[len(root):len(root) + 1] in ("", "/"):
        return path[len(root):] or "/"
    return path


def _spec(label: str, marks: Iterable[RouteLimit], rules: Iterable[RouteRule],
          is_exempt: bool, route_cost: int | None, methods: str = "",
          spent: tuple[tuple[str, int], ...] = ()) -> RouteSpec:
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
    if not hits and not costs and not spent:
        return _unlimited(label)
    return RouteSpec(label, False, max(costs, default=1), tuple(hits), tuple(shadow), spent)


_UNLIMITED: dict[str, RouteSpec] = {}


def _unlimited(label: str) -> RouteSpec:
    """The one spec of each route template without limits of its own (so that its
    requests share a limit set, and metrics and logs still name their route)."""
    spec = _UNLIMITED.get(label)
    if spec is None:
        spec = _UNLIMITED[label] = RouteSpec(label) if label else NO_ROUTE
    return spec


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
    """The ``@limit`` marks, exemption and cost set on a route's endpoint or dependencies
    (its ``@spends``: ``_endpoint_spends``)."""
    endpoint = getattr(route, "endpoint", None)
    targets = [endpoint]
    handler = _handler(endpoint, method)
    if handler is not None:
        targets.append(handler)  # a method of an HTTPEndpoint class
    marks: list[RouteLimit] = []
    is_exempt = False
    route_cost = None
    for target in targets:
        limits, target_exempt, target_cost = marks_on(target)
        marks.extend(limits)
        is_exempt = is_exempt or target_exempt
        if target_cost is not None:
            route_cost = target_cost
    marks.extend(_dependency_marks(getattr(route, "dependant", None)))
    return marks, is_exempt, route_cost


def _endpoint_spends(route: Any, method: str) -> tuple[tuple[str, int], ...]:
    """The units a route's endpoint spends (``@spends``), sorted."""
    endpoint = getattr(route, "endpoint", None)
    found = spends_on(endpoint)
    handler = _handler(endpoint, method)
    if handler is not None:
        found.update(spends_on(handler))
    return tuple(sorted(found.items()))


def _dependency_marks(dependant: Any) -> Iterator[RouteLimit]:
    """``RouteLimit`` objects used as FastAPI dependencies, at any depth."""
    for call in dependency_calls(dependant):
        if isinstance(call, RouteLimit):
            yield call


def dependency_calls(dependant: Any, depth: int = 0) -> Iterator[Any]:
    """What a FastAPI route's dependencies call (``route.dependant``), at any depth."""
    if dependant is None or depth > 20:
        return
    for sub in getattr(dependant, "dependencies", ()):
        yield sub.call
        yield from dependency_calls(sub, depth + 1)


def _host(scope: Scope) -> str:
    """The request's Host header, for apps that route on it."""
    for name, value in scope.get("headers", ()):
        if name == b"host":
            return str(value, "latin-1")
    return ""

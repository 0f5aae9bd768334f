"""The app's routes as Starlette and FastAPI keep them: the router under the middleware,
every leaf route, the route that handles a request, and the rule patterns that no route
can match (a start-up check).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from starlette.routing import Match, compile_path
from starlette.types import Scope

from .routes import RouteRule

__all__ = ["find_router", "has_hosts", "match_route", "unreachable_patterns", "walk_routes"]


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
    """The routes under a mount, a host or a router FastAPI includes; None for a leaf.
    FastAPI may keep an included router as one route whose effective route contexts are
    its routes, prefixed: each is matched and marked like a route."""
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


def match_route(
    routes: Iterable[Any], scope: Scope, prefix: str, depth: int = 0,
) -> tuple[str, Any] | None:
    """The route that will handle ``scope``, with its full path, or None. Only a full
    match counts: for a method the route does not take (a CORS preflight, a 405) its
    endpoint never runs, so its own limits are not charged."""
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
        found = match_route(children, {**scope, **child}, path, depth + 1)
        if found is not None:
            return found
    return None


def unreachable_patterns(rules: Sequence[RouteRule], router: Any) -> list[str]:
    """The patterns of ``rules`` that no route of ``router`` can match (a typo, a trailing
    slash the routes don't have): named in a start-up warning. Lenient where it can't
    tell: a pattern is only named when it surely misses."""
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

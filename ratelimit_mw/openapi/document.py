"""``document_limits(app)``: a FastAPI app's OpenAPI document describes the rate limits
and every answer the library makes on its routes.

It wraps ``app.openapi``. Each time FastAPI makes the document (once, and again when the
routes change) the middleware it finds in the app's stack adds to it:

- ``RateLimitMiddleware``: on every operation it limits, the rate-limit headers of its
  header style on every response, the 429 (its body, ``Retry-After``), the 503 of
  ``failure_mode="closed"``, and the operation's own limits (``x-ratelimit``); the
  tiers once, in ``x-ratelimit-tiers`` and in ``info.description``. Exempt operations
  get nothing.
- ``IdempotencyMiddleware``: on the methods it covers, the ``Idempotency-Key`` request
  header (required where ``required`` says), its 400/409/413/422/503 and the
  ``Idempotency-Key`` / ``X-Idempotent-Replayed`` response headers.
- ``BreakerGuard`` (as middleware: every operation) and ``breaker_dependency`` (the
  operations that depend on it): the 503 of a resting breaker.

The quota endpoints (``quota_router``), which FastAPI leaves out, are added first, so
that they get all of this too.
"""

from __future__ import annotations

import logging
import re
from typing import TYPE_CHECKING, Any

from ..app_routes import walk_routes
from ..breaker import CircuitOpenError
from ..breaker.guard import BreakerGuard, circuit_open_handler, guarding_breaker
from ..headers import HeaderFormat
from ..idempotency import IdempotencyMiddleware
from ..middleware import RateLimitMiddleware
from ..route_table import dependency_calls
from .components import HEADERS, JSON, SCHEMAS, limit_info, ref, style_headers
from .operations import add_header, add_response, idempotency_parameter, unavailable
from .quota import quota_operation

if TYPE_CHECKING:
    from fastapi import FastAPI

__all__ = ["document_limits"]

_log = logging.getLogger("ratelimit_mw")
_CONVERTOR = re.compile(r"\{([^}:]+):[^}]*\}")
_DOCUMENTED = "__ratelimit_documented__"


def document_limits(app: FastAPI) -> None:
    """Describe the rate limits, idempotency keys and breakers of ``app`` in its OpenAPI
    document (``/openapi.json``, ``/docs``). Call it once, where the app is made; it
    also answers a breaker's refusals with ``circuit_open_handler`` (unless the app
    has a handler for ``CircuitOpenError``), so that their body is the one documented.

    The middleware is found where Starlette builds it, on the first request (or on the
    first ``app.openapi()``, which builds the stack then): add every middleware before
    either.
    """
    make = getattr(app, "openapi", None)
    if not callable(make) or not hasattr(app, "openapi_schema"):
        msg = (f"document_limits needs a FastAPI app (one that makes an OpenAPI "
               f"document), got {app!r}")
        raise TypeError(msg)
    if getattr(make, _DOCUMENTED, False):
        return  # called twice: describing twice would say everything twice
    app.exception_handlers.setdefault(CircuitOpenError, circuit_open_handler)
    described: list[JSON] = []  # the document last described (a new one when routes change)

    def openapi() -> JSON:
        document: JSON = make()
        if not described or described[0] is not document:
            _describe(document, app)
            described[:] = [document]
        return document

    setattr(openapi, _DOCUMENTED, True)
    app.openapi = openapi  # type: ignore[method-assign]


def _stack(app: FastAPI) -> list[Any]:
    """Every middleware of the app's stack, outermost first (built if not yet)."""
    if app.middleware_stack is None:
        app.middleware_stack = app.build_middleware_stack()
    found: list[Any] = []
    node: Any = app.middleware_stack
    while node is not None and len(found) < 100 and not hasattr(node, "routes"):
        found.append(node)
        node = getattr(node, "app", None)
    return found


def _describe(document: JSON, app: FastAPI) -> None:
    """Add to ``document`` what the middleware of ``app`` answers on its operations."""
    stack = _stack(app)
    limiter = next((m for m in stack if isinstance(m, RateLimitMiddleware)), None)
    keyed = next((m for m in stack if isinstance(m, IdempotencyMiddleware)), None)
    guarded = [m.breaker.name for m in stack if isinstance(m, BreakerGuard)]
    if limiter is None and keyed is None:
        _log.warning("ratelimit_mw: document_limits found no RateLimitMiddleware nor "
                     "IdempotencyMiddleware in the app's middleware; the OpenAPI document "
                     "says nothing of them")
    limits = _Limits(limiter) if limiter is not None else None
    paths: JSON = document.setdefault("paths", {})
    routes = list(walk_routes(app.router.routes))
    for path, route in routes:  # FastAPI leaves quota_router's plain routes out
        found = quota_operation(route, path)
        if found is not None:
            paths.setdefault(_CONVERTOR.sub(r"{\1}", path), {}).setdefault("get", found)
    for path, route in routes:
        for method in sorted(getattr(route, "methods", None) or ()):
            operation = paths.get(_CONVERTOR.sub(r"{\1}", path), {}).get(method.lower())
            if not isinstance(operation, dict):
                continue
            own = list(operation.get("responses", {}).values())  # what the app declares
            causes = [f"the circuit breaker {name!r} is resting" for name in guarded]
            causes += [f"the circuit breaker {breaker.name!r} is resting"
                       for breaker in map(guarding_breaker,
                                          dependency_calls(getattr(route, "dependant", None)))
                       if breaker is not None]
            if limits is not None:
                causes += limits.describe(operation, own, method, path)
            if keyed is not None and method in keyed.methods:
                causes += _idempotency(operation, own, keyed, method, path)
            if causes:
                unavailable(operation, causes, echo_key=keyed is not None
                            and method in keyed.methods)
    components: JSON = document.setdefault("components", {})
    for name, schema in SCHEMAS.items():
        components.setdefault("schemas", {}).setdefault(name, schema)
    headers = {**HEADERS, **(limits.headers if limits is not None else {})}
    for name, header in headers.items():
        components.setdefault("headers", {}).setdefault(name, header)
    if limits is not None:
        limits.describe_tiers(document)


class _Limits:
    """What one ``RateLimitMiddleware`` adds to the document."""

    def __init__(self, middleware: RateLimitMiddleware) -> None:
        self.limiter = middleware.limiter
        settings = middleware.settings
        self.settings = settings
        self.headers = style_headers(HeaderFormat(settings.header_style).styles)
        self.custom_denials = middleware.on_denied is not None
        self.specs = {(method, path): spec
                      for method, path, _, spec in self.limiter.routes.declared()}

    def describe(self, operation: JSON, own: list[JSON], method: str, path: str) -> list[str]:
        """Add the limiter's answers to ``operation`` and its headers to the responses it
        declares (``own``); the causes of a 503, if any."""
        spec = self.specs.get((method, path))
        if spec is None or spec.exempt:
            return []
        limit_sets = [self.limiter.limit_sets.get(tier, spec)
                      for tier in self.limiter.tiers.tiers.values()]
        if not any(limit_set.hits for limit_set in limit_sets):
            return []
        refs = {name: ref("headers", name) for name in self.headers}
        for response in own:
            for name, header in refs.items():
                add_header(response, name, header)
        shadow = self.settings.shadow
        if not shadow and any(limit_set.enforced for limit_set in limit_sets):
            self._too_many(operation, refs)
        limits = [limit_info(hit.limit.name, hit.limit, shadow=hit in spec.shadow)
                  for hit in spec.hits]
        operation["x-ratelimit"] = {"cost": spec.cost, "limits": limits}
        text = _operation_text(spec.cost, limits)
        operation["description"] = f"{operation.get('description', '')}\n\n{text}".strip()
        if self.settings.failure_mode == "closed" and not shadow:
            return ["the rate limiter's storage is down and failure_mode is 'closed'"]
        return []

    def _too_many(self, operation: JSON, refs: dict[str, JSON]) -> None:
        """The 429, with the rate-limit headers ``refs`` and Retry-After."""
        headers = {**refs, "Retry-After": ref("headers", "Retry-After")}
        description = ("Too many requests: a limit of the caller's tier or of this "
                       "operation is used up. Retry after Retry-After seconds.")
        if self.custom_denials:
            add_response(operation, "429", description + " (The app's own body.)",
                         headers=headers)
        elif self.settings.response_format == "problem+json":
            add_response(operation, "429", description, media="application/problem+json",
                         schema=ref("schemas", "RateLimitProblem"), headers=headers)
        else:
            add_response(operation, "429", description,
                         schema=ref("schemas", "RateLimitExceeded"), headers=headers)

    def describe_tiers(self, document: JSON) -> None:
        """The tiers and their limits, once: ``x-ratelimit-tiers`` and a table in
        ``info.description``."""
        tiers = self.limiter.tiers
        lease = self.settings.concurrency_lease
        described: list[JSON] = []
        rows = ["| tier | limits | requests in flight |", "|---|---|---|"]
        for tier in tiers.tiers.values():
            limits = [limit_info(hit.limit.name, hit.limit, shadow=hit.limit.name in tier.shadow)
                      for hit in tier.hits]
            described.append({"name": tier.name, "default": tier is tiers.default,
                              "limits": limits, "concurrency": tier.concurrency})
            written = "; ".join(_limit_text(info) for info in limits) or "none"
            default = " (default)" if tier is tiers.default else ""
            rows.append(f"| {tier.name}{default} | {written} | {tier.concurrency or '-'} |")
        document["x-ratelimit-tiers"] = described
        info: JSON = document.setdefault("info", {})
        slots = (f" A request in flight holds its slot until it ends, {lease:g} s at most."
                 if any(tier.concurrency for tier in tiers.tiers.values()) else "")
        text = ("## Rate limits\n\nEvery limited operation counts against the limits of the "
                "caller's tier; some add limits of their own (`x-ratelimit`). Each response "
                "reports the limit closest to exhaustion in its headers; a refused request "
                f"gets 429 with `Retry-After`.{slots}\n\n" + "\n".join(rows))
        info["description"] = f"{info.get('description', '')}\n\n{text}".strip()


def _limit_text(info: JSON) -> str:
    """``burst: 10/minute, bursts of 20 (token_bucket)``."""
    if "rate" not in info:
        return f"{info['name']}: {info['quota']} in flight"
    burst = f", bursts of {info['burst']}" if "burst" in info else ""
    shadow = ", not enforced" if info.get("shadow") else ""
    return f"{info['name']}: {info['rate']}{burst} ({info['algorithm']}{shadow})"


def _operation_text(cost: int, limits: list[JSON]) -> str:
    """The operation's description of its cost and its own ``limits``."""
    text = "**Rate limited** by the caller's tier (see the tiers above)."
    if cost != 1:
        text += f" Each request counts {cost}."
    if limits:
        text += " Limits of its own: " + "; ".join(map(_limit_text, limits)) + "."
    return text


def _idempotency(operation: JSON, own: list[JSON], middleware: IdempotencyMiddleware,
                 method: str, path: str) -> list[str]:
    """Add the Idempotency-Key protocol to ``operation``, its response headers to the
    responses it declares (``own``); the causes of a 503, if any."""
    template = _CONVERTOR.sub(r"{\1}", path)
    parameters: list[JSON] = operation.setdefault("parameters", [])
    if not any(p.get("in") == "header" and str(p.get("name", "")).lower() == "idempotency-key"
               for p in parameters):
        parameters.append(idempotency_parameter(middleware.requires_key(method, template)))
    echo = {"Idempotency-Key": ref("headers", "Idempotency-Key")}
    for response in own:
        add_header(response, "Idempotency-Key", echo["Idempotency-Key"])
        add_header(response, "X-Idempotent-Replayed", ref("headers", "X-Idempotent-Replayed"))
    error = ref("schemas", "IdempotencyError")
    add_response(operation, "400", "The Idempotency-Key is missing where it is required, "
                 "empty, sent twice, over 255 characters or not printable ASCII.", schema=error)
    add_response(operation, "409", "A request with this Idempotency-Key is still running; "
                 "retry after Retry-After seconds.", schema=error,
                 headers={**echo, "Retry-After": ref("headers", "Retry-After")})
    add_response(operation, "413", f"A request with an Idempotency-Key may carry at most "
                 f"{middleware.max_request_size} body bytes.", schema=error, headers=echo)
    add_response(operation, "422", "This Idempotency-Key was used for a different request.",
                 schema=error, headers=echo)
    return [] if middleware.fail_open else ["the idempotency store is down"]


"""Helpers of the metrics tests: an app behind the middleware, read-outs of a registry."""

from __future__ import annotations

from typing import Any

import httpx
from prometheus_client import CollectorRegistry
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route

from ratelimit_mw import RateLimitMiddleware
from ratelimit_mw.metrics import Metrics


async def item(request: Request) -> Response:
    return PlainTextResponse(f"item {request.path_params['id']}")


def app_with(metrics: Metrics, routes: list[Route] | None = None,
             **options: Any) -> Starlette:
    """``/items/{id}`` (or ``routes``) behind the middleware, counted by ``metrics``."""
    app = Starlette(routes=routes or [Route("/items/{id}", item)])
    app.add_middleware(RateLimitMiddleware, metrics=metrics, **options)
    return app


def client_for(app: Any) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test")


def value(registry: CollectorRegistry, name: str, **labels: str) -> float:
    """The sample ``name`` with ``labels`` (0 when there is none)."""
    found = registry.get_sample_value(name, labels)
    return 0.0 if found is None else found


def label_values(registry: CollectorRegistry, name: str, label: str) -> set[str]:
    """Every value ``label`` takes in the samples of ``name``."""
    return {sample.labels[label] for family in registry.collect() for sample in family.samples
            if sample.name == name}

"""Schemathesis, every check, against the example app under uvicorn on memory storage:
the OpenAPI document tells every status, header and body the app and the library send.

The only failures let through are the upstream route's deliberate 5xx (its 502 on a
failing call, its breaker's 503): ``not_a_server_error`` is skipped there, by name; and
the quota history's 400 for a ``from`` after its ``to``, a rule between two parameters
that OpenAPI can't state (``positive_data_acceptance`` is skipped on that answer only).
The document is the example app's own, made in this process; the served one is checked
to be the same.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from openapi_spec_validator import validate
from schemathesis.config._checks import (
    MISSING_REQUIRED_HEADER_EXPECTED_STATUSES,
    MissingRequiredHeaderConfig,
)

from example_app.main import app
from ratelimit_mw.idempotency import InvalidKeyError, parse_idempotency_key
from tests.example_app.conftest import PRO, ExampleServer, env_for

pytestmark = pytest.mark.slow

UPSTREAM = ("GET", "/api/v1/upstream")
"""Fails on purpose (``failure_rate``), then its breaker refuses: 502 and 503."""
HISTORY = ("GET", "/api/v1/account/quota/history")
"""Refuses a range that ends before it starts: 400, whatever each parameter is alone."""

schema = schemathesis.openapi.from_dict(app.openapi())
# A rate limiter answers before the handler looks at a header: a request that lacks a
# required one may be told 429 (schemathesis lets 429 pass its other checks likewise).
schema.config.checks.missing_required_header = MissingRequiredHeaderConfig(
    expected_statuses=[*MISSING_REQUIRED_HEADER_EXPECTED_STATUSES, "429"])
SETTINGS = settings(max_examples=12, deadline=None, suppress_health_check=list(HealthCheck))


@pytest.fixture(scope="module")
def example_url() -> Iterator[str]:
    """The example app under uvicorn, on memory storage, serving this same document."""
    server = ExampleServer(env_for(None, None)).start()
    try:
        served = httpx.get(f"{server.url}/openapi.json", timeout=10).json()
        assert served == app.openapi(), "the served document is not the one tested"
        yield server.url
    finally:
        server.close()


def test_the_document_is_valid_openapi() -> None:
    """openapi-spec-validator finds nothing wrong with the document."""
    validate(app.openapi())


def check(case: schemathesis.Case, base_url: str, caller: dict[str, str]) -> None:
    """Call the app as ``caller`` and run every check (the upstream's 5xx excepted).

    Two things of a generated request are made as a real client makes them: a usable
    Idempotency-Key is a fresh one (hypothesis draws the same few keys again and again,
    for other requests: each a 422, rightly; tests/idempotency covers reuse), and the
    slow route sleeps 0.1 s at most, not up to 30."""
    headers = case.headers or {}
    if usable_key(headers.get("Idempotency-Key")):
        headers["Idempotency-Key"] = str(uuid.uuid4())
    if case.path == "/api/v1/slow" and a_wait((case.query or {}).get("seconds")):
        case.query["seconds"] = 0.1
    response = case.call(base_url=base_url, headers=caller)
    excluded = []
    if (case.method, case.path) == UPSTREAM:
        excluded.append(schemathesis.checks.not_a_server_error)
    if (case.method, case.path) == HISTORY and reversed_range(response):
        excluded.append(schemathesis.checks.positive_data_acceptance)
    case.validate_response(response, excluded_checks=excluded)


def reversed_range(response: schemathesis.Response) -> bool:
    """True for the history's 400 to a ``from`` after its ``to``."""
    return response.status_code == 400 and "'from' must not be after 'to'" in response.text


def a_wait(value: object) -> bool:
    """True for a ``seconds`` the slow route takes and sleeps on (0 < seconds <= 30)."""
    if isinstance(value, str) and re.fullmatch(r"[0-9]+(\.[0-9]+)?", value):
        value = float(value)
    return isinstance(value, int | float) and not isinstance(value, bool) and 0 < value <= 30


def usable_key(value: object) -> bool:
    """True for an Idempotency-Key the middleware takes."""
    if not isinstance(value, str):
        return False
    try:
        parse_idempotency_key([value])
    except InvalidKeyError:
        return False
    return True


@schema.parametrize()
@SETTINGS
def test_anonymous_callers_get_what_the_document_says(
    case: schemathesis.Case, example_url: str,
) -> None:
    """Anonymous (5/minute by client IP): 429s within a few requests, as documented."""
    check(case, example_url, {})


@schema.parametrize()
@SETTINGS
def test_a_pro_caller_gets_what_the_document_says(
    case: schemathesis.Case, example_url: str,
) -> None:
    """The pro tier: the routes' own answers, with their rate-limit headers."""
    check(case, example_url, PRO)

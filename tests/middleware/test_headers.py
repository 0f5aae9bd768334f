"""Rate-limit headers in each style, on allowed and denied responses."""

from __future__ import annotations

import base64
import math
import re
from collections.abc import AsyncIterator

import pytest

from ratelimit_mw import ConfigError, Hit, Limit, MemoryStorage, RedisStorage, Storage
from ratelimit_mw.headers import HeaderFormat, parse_header_style, retry_after_value
from ratelimit_mw.tiers import Tier
from tests.conftest import FakeClock

from .conftest import client_for, make_app

# The fake clock starts 20 s into an epoch-aligned minute: a fixed window resets in 40 s.
FIXED = [Limit("5/minute", "fixed_window", name="minute")]
RESET_EPOCH = 1_700_000_040
RATE_HEADERS = ("x-ratelimit-", "ratelimit")


def _rate_headers(response: object) -> dict[str, str]:
    headers = response.headers  # type: ignore[attr-defined]
    return {k: v for k, v in headers.items() if k.startswith(RATE_HEADERS) or k == "retry-after"}


async def _first(style: str, clock: FakeClock, memory: MemoryStorage) -> dict[str, str]:
    app = make_app(tiers=[Tier("t", FIXED)], storage=memory, clock=clock, header_style=style)
    async with client_for(app) as client:
        response = await client.get("/")
    assert response.status_code == 200
    return _rate_headers(response)


async def test_legacy_headers_exact(clock: FakeClock, memory: MemoryStorage) -> None:
    """legacy: X-RateLimit-Limit/Remaining/Reset (epoch) and Policy with a comment."""
    assert await _first("legacy", clock, memory) == {
        "x-ratelimit-limit": "5",
        "x-ratelimit-remaining": "4",
        "x-ratelimit-reset": str(RESET_EPOCH),
        "x-ratelimit-policy": '5;w=60;comment="per minute"',
    }


async def test_draft6_headers_exact(clock: FakeClock, memory: MemoryStorage) -> None:
    """draft-6: RateLimit-Limit/Remaining/Reset (delta seconds) and RateLimit-Policy."""
    assert await _first("draft-6", clock, memory) == {
        "ratelimit-limit": "5",
        "ratelimit-remaining": "4",
        "ratelimit-reset": "40",
        "ratelimit-policy": "5;w=60",
    }


async def test_draft7_headers_exact(clock: FakeClock, memory: MemoryStorage) -> None:
    """draft-7: one combined RateLimit header and RateLimit-Policy."""
    assert await _first("draft-7", clock, memory) == {
        "ratelimit": "limit=5, remaining=4, reset=40",
        "ratelimit-policy": "5;w=60",
    }


async def test_draft11_headers_exact(clock: FakeClock, memory: MemoryStorage) -> None:
    """draft-11: structured RateLimit-Policy and RateLimit naming the policy."""
    assert await _first("draft-11", clock, memory) == {
        "ratelimit-policy": '"minute";q=5;w=60',
        "ratelimit": '"minute";r=4;t=40',
    }


async def test_legacy_plus_draft11(clock: FakeClock, memory: MemoryStorage) -> None:
    """A combined style sends both sets of headers."""
    headers = await _first("legacy+draft-11", clock, memory)
    assert headers["x-ratelimit-remaining"] == "4"
    assert headers["ratelimit"] == '"minute";r=4;t=40'


async def test_no_headers_style(clock: FakeClock, memory: MemoryStorage) -> None:
    """header_style='none' sends no rate-limit header at all."""
    assert await _first("none", clock, memory) == {}


async def test_draft11_lists_every_policy(clock: FakeClock, memory: MemoryStorage) -> None:
    """draft-11 lists every limit; legacy reports the one nearest exhaustion."""
    tier = Tier("t", [Limit("100/minute", "fixed_window", name="minute"),
                      Limit("3/hour", "fixed_window", name="hourly")])
    app = make_app(tiers=[tier], storage=memory, clock=clock, header_style="legacy+draft-11")
    async with client_for(app) as client:
        response = await client.get("/")
    # 1_700_000_000 is 800 s past an epoch-aligned hour: the hour resets in 2800 s.
    assert response.headers["ratelimit-policy"] == '"minute";q=100;w=60,"hourly";q=3;w=3600'
    assert response.headers["ratelimit"] == '"minute";r=99;t=40,"hourly";r=2;t=2800'
    assert response.headers["x-ratelimit-limit"] == "3"
    assert response.headers["x-ratelimit-reset"] == str(1_700_002_800)


async def test_draft11_partition_key(clock: FakeClock, memory: MemoryStorage) -> None:
    """partition_key adds each caller's pk (a 12-byte digest, never the key itself) to every
    RateLimit item: the same for one caller's requests, different between callers."""
    tier = Tier("t", [Limit("100/minute", "fixed_window", name="minute"),
                      Limit("3/hour", "fixed_window", name="hourly")])
    app = make_app(tiers=[tier], storage=memory, clock=clock, header_style="draft-11",
                   partition_key=True)
    async with client_for(app) as one, client_for(app, ("198.51.100.1", 1)) as two:
        first, second, other = await one.get("/"), await one.get("/"), await two.get("/")
    pks = []
    for response in (first, second, other):
        items = response.headers["ratelimit"].split(",")
        assert len(items) == 2
        found = {re.fullmatch(r'"\w+";r=\d+;t=\d+;pk=:([A-Za-z0-9+/=]+):', item).group(1)
                 for item in items}  # type: ignore[union-attr]
        assert len(found) == 1
        pks.append(found.pop())
    assert pks[0] == pks[1] != pks[2]
    assert len(base64.b64decode(pks[0])) == 12
    assert "203.0.113.7" not in first.headers["ratelimit"]
    assert "pk=" not in response.headers["ratelimit-policy"]


async def test_retry_after_only_on_429(clock: FakeClock, memory: MemoryStorage) -> None:
    """Retry-After is absent on allowed responses and an integer on the 429."""
    app = make_app(tiers=[Tier("t", "1/minute")], storage=memory, clock=clock)
    async with client_for(app) as client:
        allowed = await client.get("/")
        denied = await client.get("/")
    assert "retry-after" not in allowed.headers
    assert denied.status_code == 429
    assert denied.headers["retry-after"].isdigit()
    assert denied.headers["x-ratelimit-remaining"] == "0"


@pytest.mark.parametrize(("seconds", "expected"), [
    (0.0, b"0"), (0.000001, b"1"), (17.2, b"18"), (18.0, b"18"), (2.999999, b"3"),
])
def test_retry_after_rounds_up(seconds: float, expected: bytes) -> None:
    """Retry-After rounds a fractional wait up, never down."""
    assert retry_after_value(seconds) == expected


def test_retry_after_never_is_absent() -> None:
    """A wait that never ends has no Retry-After value."""
    assert retry_after_value(math.inf) is None


@pytest.mark.parametrize("style", ["legacy", "draft-6", "draft7", "DRAFT-11", "legacy+draft-6",
                                   "none"])
def test_header_styles_parse(style: str) -> None:
    """Known styles and legacy combinations parse, case-insensitively."""
    parse_header_style(style)


@pytest.mark.parametrize("style", ["draft-8", "legacy+legacy", "draft-7+draft-11", "x"])
def test_bad_header_style_is_a_config_error(style: str) -> None:
    """Unknown or colliding styles are refused with a clear error."""
    with pytest.raises(ConfigError, match="header style"):
        parse_header_style(style)


async def test_the_reported_decision_is_the_one_the_headers_name(memory: MemoryStorage) -> None:
    """With a concurrency slot nearer its end than the rate limit, an admitted verdict's
    ``binding`` is still the rate limit, as in X-RateLimit-*: free slots are not a
    quota to pace against."""
    rate = Hit(Limit("5/minute", "fixed_window"))
    slot = Hit(Limit.concurrency(2))
    verdict = await memory.decide("k", [rate, slot])
    assert verdict.allowed
    assert [d.remaining for d in verdict.decisions] == [4, 1]
    assert verdict.binding is not None and verdict.binding.limit == rate.limit
    headers = dict(HeaderFormat("legacy").dynamic(verdict, {}, 1_700_000_000.0))
    assert headers[b"x-ratelimit-remaining"] == b"4"


@pytest.fixture(params=["memory", "redis"])
async def storage(request: pytest.FixtureRequest, clock: FakeClock) -> AsyncIterator[Storage]:
    """Memory storage on the fake clock, or Redis (on its own clock)."""
    if request.param == "memory":
        yield MemoryStorage(clock=clock)
        return
    redis = RedisStorage.from_url(request.getfixturevalue("redis_url"),
                                  prefix=request.getfixturevalue("redis_prefix"))
    yield redis
    await redis.close()


def _trial_tier() -> Tier:
    """An enforced 10/minute beside a 2/minute shadow limit being tried out."""
    return Tier("t", [Limit("10/minute", "fixed_window", name="enforced"),
                      Limit("2/minute", "fixed_window", name="trial")], shadow=["trial"])


def _without_resets(headers: dict[str, str]) -> dict[str, str]:
    """``headers`` with every reset time replaced by ``N`` (Redis keeps its own clock)."""
    return {k: re.sub(r"(reset=|;t=)\d+", r"\1N", v) for k, v in headers.items()
            if not k.endswith("-reset")}


@pytest.mark.parametrize(("style", "expected"), [
    ("legacy", {"x-ratelimit-limit": "10", "x-ratelimit-remaining": "6",
                "x-ratelimit-policy": '10;w=60;comment="per minute"'}),
    ("draft-6", {"ratelimit-limit": "10", "ratelimit-remaining": "6",
                 "ratelimit-policy": "10;w=60"}),
    ("draft-7", {"ratelimit": "limit=10, remaining=6, reset=N", "ratelimit-policy": "10;w=60"}),
    ("draft-11", {"ratelimit-policy": '"enforced";q=10;w=60', "ratelimit": '"enforced";r=6;t=N'}),
])
async def test_admitted_responses_leave_shadow_limits_out(
    style: str, expected: dict[str, str], storage: Storage, clock: FakeClock,
) -> None:
    """An admitted response reports the enforced limit, not a shadow limit it has run
    out of: a client must not pace itself by a limit that holds nobody back."""
    app = make_app(tiers=[_trial_tier()], storage=storage, clock=clock, header_style=style)
    async with client_for(app) as client:
        responses = [await client.get("/") for _ in range(4)]
    assert [r.status_code for r in responses] == [200] * 4
    assert _without_resets(_rate_headers(responses[-1])) == expected


async def test_refused_responses_leave_shadow_limits_out(
    storage: Storage, clock: FakeClock,
) -> None:
    """A 429 names the enforced limit that refused it, in RateLimit as in RateLimit-Policy."""
    app = make_app(tiers=[_trial_tier()], storage=storage, clock=clock,
                   header_style="draft-11")
    async with client_for(app) as client:
        responses = [await client.get("/") for _ in range(11)]
    assert responses[-1].status_code == 429
    assert _without_resets(_rate_headers(responses[-1])) == {
        "ratelimit-policy": '"enforced";q=10;w=60', "ratelimit": '"enforced";r=0;t=N',
        "retry-after": responses[-1].headers["retry-after"]}


async def test_global_shadow_mode_reports_what_enforcing_would(
    clock: FakeClock, memory: MemoryStorage,
) -> None:
    """In shadow mode the headers are those the same limits give once enforced: a tier's
    shadow limits stay out, as they would then."""
    app = make_app(tiers=[_trial_tier()], storage=memory, clock=clock,
                   header_style="draft-11", shadow=True)
    async with client_for(app) as client:
        responses = [await client.get("/") for _ in range(2)]
    assert responses[-1].headers["ratelimit-policy"] == '"enforced";q=10;w=60'
    assert responses[-1].headers["ratelimit"] == '"enforced";r=8;t=40'


async def test_a_tier_of_shadow_limits_alone_reports_them(
    clock: FakeClock, memory: MemoryStorage,
) -> None:
    """When every limit is a shadow limit (a whole tier on trial), the headers report them
    all, as global shadow mode does: nothing is enforced, and seeing them is the point."""
    tier = Tier("t", [Limit("2/minute", "fixed_window", name="trial")], shadow=["trial"])
    app = make_app(tiers=[tier], storage=memory, clock=clock, header_style="legacy+draft-11")
    async with client_for(app) as client:
        responses = [await client.get("/") for _ in range(3)]
    assert [r.status_code for r in responses] == [200] * 3
    assert _rate_headers(responses[-1]) == {
        "ratelimit-policy": '"trial";q=2;w=60', "ratelimit": '"trial";r=0;t=40',
        "x-ratelimit-limit": "2", "x-ratelimit-remaining": "0",
        "x-ratelimit-reset": str(RESET_EPOCH), "x-ratelimit-policy": '2;w=60;comment="per minute"'}


async def test_policy_names_are_escaped_once(clock: FakeClock, memory: MemoryStorage) -> None:
    """A policy name with a quote or a backslash is one RFC 9651 string, the same in
    RateLimit-Policy and RateLimit, and the 429's violated-policies name it as the
    headers spell it (a character a header can't carry is ``_`` in both)."""
    tier = Tier("t", [Limit("1/minute", "fixed_window", name='say "hi" ü'),
                      Limit("5/hour", "fixed_window", name="C:\\api")])
    app = make_app(tiers=[tier], storage=memory, clock=clock, header_style="draft-11",
                   response_format="problem+json")
    async with client_for(app) as client:
        await client.get("/")
        denied = await client.get("/")
    assert denied.status_code == 429
    assert denied.headers["ratelimit-policy"] == '"say \\"hi\\" _";q=1;w=60,"C:\\\\api";q=5;w=3600'
    assert denied.headers["ratelimit"] == '"say \\"hi\\" _";r=0;t=40,"C:\\\\api";r=4;t=2800'
    assert denied.json()["violated-policies"] == ['say "hi" _']

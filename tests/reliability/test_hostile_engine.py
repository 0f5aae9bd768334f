"""Hostile input reaching the engine: odd rate strings and keys never crash it."""

from __future__ import annotations

import asyncio
import uuid

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ratelimit_mw import ConfigError, Hit, Limit, MemoryStorage, RedisStorage
from ratelimit_mw.rates import split_rates

pytestmark = pytest.mark.reliability

rate_like = st.one_of(
    st.text(max_size=60),
    st.from_regex(r"\A-?\d{0,25}\s*(/|per)?\s*\d{0,6}\s*(second|minute|hour|day|month|year)s?"
                  r"(\s*[;,|]\s*\d{0,4}/\w{0,8})?\Z"),
)


@settings(max_examples=500, deadline=None)
@given(rate_like)
def test_any_rate_string_parses_or_is_a_config_error(text: str) -> None:
    """Whatever the text, parsing returns valid rates or raises ConfigError naming it."""
    try:
        rates = split_rates(text)
    except ConfigError as exc:
        assert repr(text) in str(exc)
    else:
        assert rates and all(r.amount >= 1 and r.period > 0 for r in rates)


keys = st.one_of(st.text(max_size=300), st.binary(max_size=300).map(lambda b: b.decode("latin-1")),
                 st.text(min_size=5000, max_size=12000))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(keys, min_size=1, max_size=5))
def test_any_key_decides_on_memory_and_redis(redis_url: str, batch: list[str]) -> None:
    """Random keys (surrogates, NULs, 10 kB) decide the same on memory and on Redis."""
    hit = Hit(Limit("1/minute", "gcra", burst=1))

    async def run() -> None:
        prefix = f"rltest:{uuid.uuid4().hex[:12]}:"
        memory, redis_storage = MemoryStorage(), RedisStorage.from_url(redis_url, prefix=prefix)
        try:
            for key in batch:
                a = await memory.decide(key, [hit])
                b = await redis_storage.decide(key, [hit])
                assert (a.allowed, a.decisions[0].remaining) == (
                    b.allowed, b.decisions[0].remaining)
            for key in set(batch):
                await redis_storage.reset(key)
        finally:
            await redis_storage.close()

    asyncio.run(run())

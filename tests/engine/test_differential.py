"""Memory and Redis give identical decisions on the same simulated time.

Redis is driven on simulated time through the storage's test-only ``clock`` hook,
which the script takes instead of ``TIME``.
"""

from __future__ import annotations

import random

import pytest

from ratelimit_mw import ALGORITHM_NAMES, Hit, Limit, MemoryStorage, RedisStorage, Verdict
from tests.conftest import FakeClock


def _limits(algorithm: str, rng: random.Random) -> list[Limit]:
    """Three limits of one algorithm with small, varied shapes."""
    made = []
    for _ in range(3):
        amount, period = rng.randint(1, 8), rng.choice([1, 2, 3, 7, 10, 60])
        burst = rng.randint(1, 10) if algorithm in ("token_bucket", "gcra") else None
        made.append(Limit.parse(f"{amount}/{period} seconds", algorithm, burst=burst))
    return made


def _summary(verdict: Verdict) -> tuple[object, ...]:
    return verdict.allowed, tuple(
        (d.allowed, d.limit, d.remaining, d.reset_after, d.retry_after, d.scope)
        for d in verdict.decisions
    )


@pytest.mark.parametrize("algorithm", [*ALGORITHM_NAMES, "mixed"])
@pytest.mark.parametrize("seed", [1, 2])
async def test_memory_and_redis_agree_step_by_step(
    redis_url: str, redis_prefix: str, algorithm: str, seed: int,
) -> None:
    """A thousand random steps (time, keys, costs, several limits) decide identically."""
    rng = random.Random(f"{algorithm}-{seed}")
    clock = FakeClock(1_700_000_000 + rng.random() * 1000)
    memory = MemoryStorage(clock=clock)
    redis_storage = RedisStorage.from_url(redis_url, prefix=redis_prefix, clock=clock)
    names = ALGORITHM_NAMES if algorithm == "mixed" else (algorithm,)
    limits = [limit for name in names for limit in _limits(name, rng)]
    try:
        for step in range(1000):
            clock.advance(rng.choice([0, 0, 1e-6, rng.random() * 0.5, rng.random() * 5,
                                      rng.random() * 30]))
            key = rng.choice(["a", "b", "c:{d}"])
            chosen = rng.sample(limits, rng.randint(1, min(4, len(limits))))
            hits = [Hit(limit, rng.choice([0, 1, 1, 1, 2, 3, 9]), rng.choice(["", "/r"]))
                    for limit in chosen]
            if rng.random() < 0.05:
                await memory.reset(key)
                await redis_storage.reset(key)
                continue
            expected = _summary(await memory.decide(key, hits))
            got = _summary(await redis_storage.decide(key, hits))
            assert got == expected, f"step {step} at {clock.now!r}: {hits}"
    finally:
        await redis_storage.close()

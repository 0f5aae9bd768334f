"""The leaky bucket as a queue: a request that fits within ``max_delay`` is admitted with
its turn ahead (the algorithm's arithmetic, on its own)."""

from __future__ import annotations

import pytest

from ratelimit_mw import ConfigError, Limit
from ratelimit_mw.limits import decide

S = 1_000_000
START = 1_700_000_000 * S


def test_nginxs_example_holds_four_and_refuses_the_sixth() -> None:
    """1 r/s with room for 4 s of waiting (nginx's ``rate=1r/s burst=5``): six requests
    at once get turns 0, 1, 2, 3, 4 s ahead; the sixth is refused, told to come back
    when it would fit (1 s)."""
    limit = Limit("1/second", "leaky_bucket", max_delay=4)
    state = None
    waits, refused = [], None
    for _ in range(6):
        step = decide(state, START, limit, 1)
        if not step.allowed:
            refused = step
            break
        waits.append(step.retry_us)
        state = step.state
    assert waits == [0, 1 * S, 2 * S, 3 * S, 4 * S]
    assert refused is not None and refused.retry_us == 1 * S


def test_turns_keep_the_rate_across_a_burst() -> None:
    """Twelve requests at once at 2 a second, held up to 5 s: eleven turns half a
    second apart (the first at once), the twelfth refused without a turn."""
    limit = Limit("2/second", "leaky_bucket", max_delay="5s")
    state = None
    steps = []
    for _ in range(12):
        step = decide(state, START, limit, 1)
        steps.append(step)
        if step.allowed:
            state = step.state
    waits = [step.retry_us for step in steps if step.allowed]
    assert waits == [k * S // 2 for k in range(11)]
    assert not steps[11].allowed and steps[11].retry_us == S // 2


def test_a_limit_without_max_delay_still_refuses_what_does_not_fit() -> None:
    """The meter: a burst of 2 at once (its default), the third refused, no turn taken."""
    limit = Limit("2/second", "leaky_bucket")
    first = decide(None, START, limit, 1)
    second = decide(first.state, START, limit, 1)
    third = decide(second.state, START, limit, 1)
    assert (first.retry_us, second.retry_us) == (0, 0)
    assert not third.allowed and third.retry_us == S // 2
    assert third.state == second.state


def test_a_shaped_limit_lets_one_through_at_once_unless_given_a_burst() -> None:
    """Shaping smooths: by default one request at once; ``burst=3`` lets three."""
    assert Limit("2/second", "gcra", max_delay=5).capacity == 1
    assert Limit("2/second", "gcra", max_delay=5, burst=3).capacity == 3


@pytest.mark.parametrize(("value", "seconds"), [(5, 5.0), ("5s", 5.0), ("500ms", 0.5),
                                                ("2m", 120.0), (0, 0.0)])
def test_max_delay_reads_seconds_and_durations(value: object, seconds: float) -> None:
    assert Limit("2/second", "gcra", max_delay=value).max_delay == seconds


@pytest.mark.parametrize(("options", "match"), [
    ({"algorithm": "token_bucket", "max_delay": "5s"}, "leaky bucket"),
    ({"algorithm": "gcra", "max_delay": "-1s"}, "max_delay='-1s'"),
    ({"algorithm": "gcra", "max_delay": "soon"}, "soon"),
    ({"algorithm": "gcra", "max_delay": 7200}, "7200"),
])
def test_a_bad_max_delay_is_named(options: dict[str, object], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        Limit("2/second", **options)  # type: ignore[arg-type]

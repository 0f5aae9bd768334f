"""Rates and limits: parsed with the limits package's grammar, bad input named."""

from __future__ import annotations

import os
import re

import pytest

from ratelimit_mw import ConfigError, Hit, Limit
from ratelimit_mw.limits import as_limits
from ratelimit_mw.rates import MAX_AMOUNT, MAX_PERIOD, Rate, parse_rate, split_rates


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("10/minute", [Rate(10, 60)]),
        ("100 per hour", [Rate(100, 3600)]),
        ("10/minute; 1000/day", [Rate(10, 60), Rate(1000, 86400)]),
        ("5/30 seconds", [Rate(5, 30)]),
        ("1/second", [Rate(1, 1)]),
        ("2 per 3 hours", [Rate(2, 10800)]),
        ("1/year", [Rate(1, 365 * 86400)]),  # limits' own grammar counts 360 days
        ("5/10 years", [Rate(5, 3650 * 86400)]),
    ],
)
def test_parses_rate_notation(text: str, expected: list[Rate]) -> None:
    """Every notation of the limits package gives the same amount and period."""
    assert split_rates(text) == expected


@pytest.mark.parametrize(
    "text",
    ["", "ten/minute", "10/fortnight", "-1/minute", "0/minute", "5/0 seconds", "10 minute",
     "10/minute;;", "10/minute; 0/day", "1e3/minute"],
)
def test_rejects_bad_rates_naming_them(text: str) -> None:
    """A bad rate is a ConfigError whose message quotes the string."""
    with pytest.raises(ConfigError, match=re.escape(repr(text))):
        split_rates(text)


def test_non_string_rate_is_rejected() -> None:
    """A number where a rate string belongs fails with a clear error."""
    with pytest.raises(ConfigError, match="not a string"):
        split_rates(10)  # type: ignore[arg-type]


def test_parse_rate_wants_exactly_one() -> None:
    """parse_rate refuses a list of rates."""
    with pytest.raises(ConfigError, match="single rate"):
        parse_rate("1/second; 5/minute")


@pytest.mark.parametrize(
    ("rate", "text"),
    [(Rate(10, 60), "10/minute"), (Rate(5, 30), "5/30 seconds"), (Rate(3, 7200), "3/2 hours"),
     (Rate(1, 86400), "1/day"), (Rate(2, 0.5), "2/0.5 seconds"),
     (parse_rate("1/year"), "1/year"), (parse_rate("5/10 years"), "5/10 years")],
)
def test_rates_print_readably(rate: Rate, text: str) -> None:
    """str(Rate) reads like the notation it came from."""
    assert str(rate) == text


@pytest.mark.parametrize("amount", [0, -3, 1.5, True, "10"])
def test_rate_amount_must_be_positive_int(amount: object) -> None:
    """Rate(amount, ...) rejects zero, negatives, floats, bools and strings."""
    with pytest.raises(ConfigError, match="amount"):
        Rate(amount, 60)  # type: ignore[arg-type]


@pytest.mark.parametrize("period", [0, -1, float("nan"), float("inf"), 1e-9])
def test_rate_period_must_be_positive(period: float) -> None:
    """Rate(..., period) rejects zero, negative, NaN, infinite and sub-microsecond periods."""
    with pytest.raises(ConfigError, match="period"):
        Rate(10, period)


@pytest.mark.parametrize(("text", "match"), [
    ("1/150 years", r"rate '1/150 years': rate period must be at most ten years"),
    ("10/99999999999999999999 days", "at most ten years"),
    ("1000000000001/second", "at most 1,000,000,000,000, got 1000000000001"),
])
def test_rates_beyond_what_can_be_counted_exactly_are_refused(text: str, match: str) -> None:
    """A period over ten years, or more than a trillion requests: refused, naming the rate
    (Redis's Lua counts microseconds in doubles, which lose whole microseconds far
    enough out; its searches for the retry time would then never end)."""
    with pytest.raises(ConfigError, match=match):
        Limit(text)


def test_the_longest_rates_are_accepted() -> None:
    """The bounds themselves pass: ten years, a trillion requests, a ten-year refill."""
    assert Rate(1, MAX_PERIOD).period == MAX_PERIOD
    assert Limit(f"{MAX_AMOUNT}/second").capacity == MAX_AMOUNT
    assert Limit(Rate(1, 86400), "token_bucket", burst=3650).capacity == 3650
    with pytest.raises(ConfigError, match=r"3,651 days to refill from empty, more than ten years"):
        Limit(Rate(1, 86400), "token_bucket", burst=3651)
    with pytest.raises(ConfigError, match="would take 694,444 days to refill"):
        Limit("1/minute", "gcra", burst=1_000_000_000)


def test_limit_from_a_rate_string_and_defaults() -> None:
    """Limit builds from a rate string; capacity is the burst for buckets, else the amount."""
    bucket = Limit("10/minute", "token_bucket", burst=20)
    window = Limit("10/minute")
    assert (bucket.capacity, bucket.algorithm, bucket.period) == (20, "token_bucket", 60)
    assert (window.capacity, window.algorithm) == (10, "sliding_window")
    assert str(bucket) == "token_bucket 10/minute burst 20"


@pytest.mark.parametrize(
    ("alias", "name"),
    [("leaky-bucket", "gcra"), ("moving_window", "sliding_log"), ("Fixed-Window", "fixed_window"),
     ("sliding_window_counter", "sliding_window")],
)
def test_algorithm_aliases(alias: str, name: str) -> None:
    """Common spellings of the algorithms are accepted."""
    assert Limit("1/second", alias).algorithm == name


def test_unknown_algorithm_is_named() -> None:
    """An unknown algorithm fails when the limit is built, naming it and the known ones."""
    with pytest.raises(ConfigError, match=r"unknown algorithm 'bogus'.*gcra"):
        Limit("1/second", "bogus")


@pytest.mark.parametrize("burst", [0, -1, 2.5])
def test_bad_burst(burst: object) -> None:
    """A burst must be a positive integer."""
    with pytest.raises(ConfigError, match="burst"):
        Limit("1/second", "gcra", burst=burst)  # type: ignore[arg-type]


def test_burst_only_for_buckets() -> None:
    """A burst on a window algorithm is a mistake, reported as such."""
    with pytest.raises(ConfigError, match="only applies to token_bucket and gcra"):
        Limit("1/second", "fixed_window", burst=5)


@pytest.mark.parametrize("cost", [-1, 1.5, "2", True])
def test_bad_cost_fails_when_the_hit_is_built(cost: object) -> None:
    """A negative or non-integer cost fails when the hit is built, not per request."""
    with pytest.raises(ConfigError, match="cost"):
        Hit(Limit("1/second"), cost)  # type: ignore[arg-type]


def test_as_limits_splits_rates() -> None:
    """as_limits builds one limit per rate, with one algorithm and burst."""
    built = as_limits("10/minute; 1000/day", "gcra", burst=30)
    assert [(lim.rate, lim.algorithm, lim.burst) for lim in built] == [
        (Rate(10, 60), "gcra", 30), (Rate(1000, 86400), "gcra", 30)]


def test_as_limits_keeps_a_limits_own_shape() -> None:
    """In a list, a Limit keeps its algorithm while the rate strings take the given one."""
    built = as_limits([Limit("5/second", "token_bucket", burst=9), "1/minute"], "fixed_window")
    assert [str(lim) for lim in built] == [
        "token_bucket 5/second burst 9", "fixed_window 1/minute"]


def test_uid_ignores_the_display_name() -> None:
    """Counters are identified by shape, so renaming a policy keeps its counter."""
    assert Limit("5/minute", name="a").uid == Limit("5/minute", name="b").uid
    assert Limit("5/minute").uid != Limit("5/minute", "fixed_window").uid


@pytest.mark.slow
def test_a_limit_unpickled_in_another_process_hashes_like_a_fresh_one() -> None:
    """Limits key dicts and sets (policy names, shadow limits): one pickled under another
    string-hash seed must hash like the same limit built here."""
    import pickle
    import subprocess
    import sys

    code = ("import pickle, sys; from ratelimit_mw import Limit; "
            "sys.stdout.buffer.write(pickle.dumps(Limit('5/minute', 'token_bucket', "
            "burst=9, name='burst')))")
    for seed in ("1", "2"):
        data = subprocess.run([sys.executable, "-c", code], capture_output=True, check=True,
                              env={**os.environ, "PYTHONHASHSEED": seed}).stdout
        limit = pickle.loads(data)
        fresh = Limit("5/minute", "token_bucket", burst=9, name="burst")
        assert limit == fresh and hash(limit) == hash(fresh) and limit in {fresh}


def test_limits_and_hits_pickle_copy_and_stay_frozen() -> None:
    """Limits and hits (native classes in the compiled build) survive pickle, copy and
    dataclasses.replace with every field, and refuse assignment."""
    import copy
    import dataclasses
    import pickle

    limit = Limit("10/minute", "token_bucket", burst=20, name="burst")
    hit = Hit(limit, 3, "POST /reports")
    for twin in (pickle.loads(pickle.dumps(hit)), copy.copy(hit), copy.deepcopy(hit)):
        assert twin == hit and hash(twin) == hash(hit)
        assert (twin.cost, twin.scope, twin.slot) == (3, "POST /reports", hit.slot)
        assert twin.limit.capacity == 20 and twin.limit.uid == limit.uid
    renamed = dataclasses.replace(limit, name="other")
    assert renamed.name == "other" and renamed.uid == limit.uid and renamed != limit
    assert dataclasses.replace(hit, cost=5).cost == 5
    with pytest.raises(dataclasses.FrozenInstanceError):
        hit.cost = 5  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        limit.name = "x"  # type: ignore[misc]


@pytest.mark.parametrize(("build", "match"), [
    (lambda: Limit(10), "couldn't parse rate 10"),  # type: ignore[arg-type]
    (lambda: Limit("1/second", None), "unknown algorithm None"),
    (lambda: Limit.concurrency(2.5), "2.5"),
    (lambda: Limit.monthly("5"), "'5'"),
    (lambda: as_limits("1/second", "gcra", burst="9"), "burst must be a positive integer"),
    (lambda: Hit("1/second"), "Hit needs a Limit, got '1/second'"),  # type: ignore[arg-type]
    (lambda: Hit(Limit("1/second"), 1, 7), "scope must be a string, got 7"),
])
def test_bad_arguments_fail_with_a_config_error_naming_them(build: object, match: str) -> None:
    """Every way to build a limit or a hit checks its arguments itself, in the compiled
    build too (a typed compiled parameter would raise a TypeError naming neither)."""
    with pytest.raises(ConfigError, match=re.escape(match)):
        build()  # type: ignore[operator]


def test_limits_and_hits_can_be_subclassed() -> None:
    """Compiled, Limit and Hit still take Python subclasses (the sources always did)."""

    class Named(Limit):
        def label(self) -> str:
            return f"{self.name}!"

    class Weighted(Hit):
        pass

    limit = Named("5/minute", name="five")
    hit = Weighted(limit, 2)
    assert type(limit) is Named and limit.label() == "five!" and limit.capacity == 5
    assert hit.cost == 2 and hit.slot == ("", limit.uid) and hit == Weighted(limit, 2)

"""The client-side token bucket on a fake clock: refill, FIFO order, cancellation."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable

import pytest

from ratelimit_mw.client import TokenBucket, set_testing

from .conftest import FakeClock, settle


def parked(clock: FakeClock, rate: float = 1.0, capacity: float = 5.0) -> TokenBucket:
    """A bucket whose sleeps wait for the test to advance the clock."""
    return TokenBucket(rate=rate, capacity=capacity, clock=clock, sleep=clock.parked_sleep)


async def drain(bucket: TokenBucket) -> None:
    """Take every token so the next caller has to wait."""
    await bucket.acquire(bucket.capacity)


async def test_full_bucket_serves_at_once(clock: FakeClock) -> None:
    """A new bucket is full: up to capacity is served without waiting."""
    bucket = parked(clock)
    for _ in range(5):
        await bucket.acquire()
    assert clock.sleeps == []
    assert bucket.tokens == 0


async def test_waits_for_the_refill(clock: FakeClock) -> None:
    """An empty bucket makes the caller wait for exactly the missing tokens."""
    bucket = TokenBucket(rate=2.0, capacity=5, clock=clock, sleep=clock.auto_sleep)
    await drain(bucket)
    await bucket.acquire(3)
    assert clock.sleeps == [1.5]


async def test_refill_stops_at_capacity(clock: FakeClock) -> None:
    """Tokens do not pile up beyond capacity during idle time."""
    bucket = parked(clock)
    await drain(bucket)
    clock.move(1000)
    assert bucket.tokens == 5


@pytest.mark.parametrize("n", [0, -1, 5.5, 6, float("inf"), float("nan")])
async def test_impossible_requests_raise(clock: FakeClock, n: float) -> None:
    """Asking for nothing, a negative amount or more than capacity is a ValueError."""
    bucket = parked(clock)
    with pytest.raises(ValueError, match="capacity 5"):
        await bucket.acquire(n)
    with pytest.raises(ValueError, match="capacity 5"):
        bucket.acquire_sync(n)


@pytest.mark.parametrize(("rate", "capacity"), [
    (0, 1), (-1, 1), (1, 0), (float("inf"), 1), (True, 1), ("1", 1), (1, "5"), (1, True)])
def test_bad_settings_are_rejected(rate: object, capacity: object) -> None:
    """A bucket that could never serve anyone is refused."""
    with pytest.raises(ValueError, match="must be"):
        TokenBucket(rate=rate, capacity=capacity)  # type: ignore[arg-type]


async def test_fifo_large_waiter_is_not_overtaken(clock: FakeClock) -> None:
    """A waiting large request is served before later small ones, though they would fit sooner."""
    bucket = parked(clock)
    await drain(bucket)
    served: list[str] = []

    async def take(name: str, n: float) -> None:
        await bucket.acquire(n)
        served.append(name)

    tasks = [asyncio.create_task(take("big", 4))]
    await settle()
    tasks += [asyncio.create_task(take(f"small{i}", 1)) for i in range(3)]
    await settle()
    assert bucket.waiting == 4
    await clock.advance(1)  # one token: enough for a small one, but big is first
    assert served == []
    await clock.advance(3)
    assert served == ["big"]
    for i in range(3):
        await clock.advance(1)
        assert served == ["big"] + [f"small{j}" for j in range(i + 1)]
    await asyncio.gather(*tasks)
    assert bucket.waiting == 0


async def test_arrival_order_is_kept(clock: FakeClock) -> None:
    """Equal requests are served in the order they arrived."""
    bucket = parked(clock, capacity=1)
    await drain(bucket)
    served: list[int] = []

    async def take(i: int) -> None:
        await bucket.acquire()
        served.append(i)

    tasks = [asyncio.create_task(take(i)) for i in range(5)]
    await settle()
    for _ in range(5):
        await clock.advance(1)
    await asyncio.gather(*tasks)
    assert served == [0, 1, 2, 3, 4]


async def test_new_caller_queues_behind_waiters(clock: FakeClock) -> None:
    """A newcomer does not grab refilled tokens while others wait."""
    bucket = parked(clock)
    await drain(bucket)
    first = asyncio.create_task(bucket.acquire(2))
    await settle()
    clock.move(1)  # one token, not yet claimed by the sleeping head
    late = asyncio.create_task(bucket.acquire(1))
    await settle()
    assert not late.done()
    await clock.advance(1)
    assert first.done()
    assert not late.done()
    await clock.advance(1)
    assert late.done()


async def test_cancelled_head_loses_no_tokens_and_blocks_no_one(clock: FakeClock) -> None:
    """Cancelling the waiting head takes no tokens and lets the next waiter in at once."""
    bucket = parked(clock)
    await drain(bucket)
    big = asyncio.create_task(bucket.acquire(5))
    await settle()
    small = asyncio.create_task(bucket.acquire(1))
    await settle()
    clock.move(2)  # two tokens earned while big sleeps
    big.cancel()
    await settle()
    assert big.cancelled()
    assert small.done()  # served from the two tokens, without waiting for big's wake-up
    assert bucket.tokens == pytest.approx(1)
    assert bucket.waiting == 0


async def test_cancelled_middle_waiter_blocks_no_one(clock: FakeClock) -> None:
    """Cancelling a waiter in the middle of the queue leaves the others' order intact."""
    bucket = parked(clock, capacity=2)
    await drain(bucket)
    served: list[str] = []

    async def take(name: str, n: float) -> None:
        await bucket.acquire(n)
        served.append(name)

    a = asyncio.create_task(take("a", 1))
    await settle()
    b = asyncio.create_task(take("b", 2))
    await settle()
    c = asyncio.create_task(take("c", 1))
    await settle()
    b.cancel()
    await settle()
    await clock.advance(1)
    assert served == ["a"]
    await clock.advance(1)
    assert served == ["a", "c"]
    await asyncio.gather(a, c)
    assert b.cancelled()
    assert bucket.waiting == 0


async def test_cancelled_waiter_woken_but_not_yet_run(clock: FakeClock) -> None:
    """A waiter cancelled right after being told its turn came hands the turn on."""
    bucket = parked(clock, capacity=1)
    await drain(bucket)
    first = asyncio.create_task(bucket.acquire())
    await settle()
    second = asyncio.create_task(bucket.acquire())
    third = asyncio.create_task(bucket.acquire())
    await settle()
    clock.move(1)
    first.cancel()  # second is woken...
    await asyncio.sleep(0)
    second.cancel()  # ...and cancelled before it runs
    await settle()
    assert third.done()
    assert bucket.waiting == 0


async def test_many_tasks_share_a_bucket(clock: FakeClock) -> None:
    """Twenty tasks on a bucket of 5 at 5 per second finish after 3 s of refill."""
    bucket = TokenBucket(rate=5, capacity=5, clock=clock, sleep=clock.auto_sleep)
    start = clock.now
    await asyncio.gather(*(bucket.acquire() for _ in range(20)))
    assert clock.now - start == pytest.approx(3.0)
    assert bucket.waiting == 0


def test_sync_acquire_waits_for_refill(clock: FakeClock) -> None:
    """acquire_sync blocks for the missing tokens, using the injected sleep."""
    bucket = TokenBucket(rate=4, capacity=4, clock=clock, sleep_sync=clock.sleep)
    bucket.acquire_sync(4)
    bucket.acquire_sync(2)
    assert clock.sleeps == [0.5]


def eventually(predicate: Callable[[], bool]) -> None:
    """Wait (at most 5 s) for another thread to make ``predicate`` true."""
    done = threading.Event()
    for _ in range(5000):
        if predicate():
            return
        done.wait(0.001)
    raise AssertionError("condition never became true")


def test_sync_threads_are_served_in_order(clock: FakeClock) -> None:
    """Threads queue FIFO too: a big request is not overtaken by later small ones."""
    moved = threading.Condition()

    def sleep_sync(seconds: float) -> None:
        with moved:
            deadline = clock.now + seconds
            moved.wait_for(lambda: clock.now >= deadline - 1e-9, timeout=5)

    def advance(seconds: float) -> None:
        with moved:
            clock.move(seconds)
            moved.notify_all()

    bucket = TokenBucket(rate=1, capacity=3, clock=clock, sleep_sync=sleep_sync)
    bucket.acquire_sync(3)
    served: list[str] = []

    def take(name: str, n: float) -> None:
        bucket.acquire_sync(n)
        served.append(name)

    threads = []
    for name, n in [("big", 3), ("small1", 1), ("small2", 1)]:
        thread = threading.Thread(target=take, args=(name, n))
        thread.start()
        threads.append(thread)
        eventually(lambda: bucket.waiting == len(threads))  # queued before the next starts
    advance(1)
    advance(1)
    assert served == []
    advance(1)
    eventually(lambda: len(served) == 1)
    advance(2)
    eventually(lambda: len(served) == 3)
    for thread in threads:
        thread.join(timeout=5)
    assert served == ["big", "small1", "small2"]


async def test_adaptive_bucket_follows_the_server(clock: FakeClock) -> None:
    """update() lowers the tokens and pauses until the server's reset when none remain."""
    bucket = TokenBucket(rate=1, capacity=5, adaptive=True, clock=clock, sleep=clock.auto_sleep)
    bucket.update(remaining=2, reset_after=60)
    assert bucket.tokens == 2
    bucket.update(remaining=0, reset_after=10)
    assert bucket.tokens == 0
    await bucket.acquire(1)
    assert clock.sleeps == [11.0]  # 10 s paused, then 1 s to earn a token


def test_non_adaptive_bucket_ignores_the_server(clock: FakeClock) -> None:
    """Without adaptive=True, update() changes nothing."""
    bucket = TokenBucket(rate=1, capacity=5, clock=clock)
    bucket.update(remaining=0, reset_after=10)
    assert bucket.tokens == 5


async def test_testing_mode_is_instant(clock: FakeClock) -> None:
    """set_testing(True) makes acquire return at once, in both forms."""
    bucket = parked(clock, capacity=1)
    await drain(bucket)
    set_testing(True)
    await bucket.acquire()
    bucket.acquire_sync()
    assert clock.sleeps == []


def test_repr_shows_live_state(clock: FakeClock) -> None:
    """The repr shows rate, capacity, tokens and queue length."""
    bucket = TokenBucket(rate=2, capacity=10, clock=clock, sleep_sync=clock.sleep)
    bucket.acquire_sync(4)
    assert repr(bucket) == "TokenBucket(rate=2/s, capacity=10, tokens=6, waiting=0)"


async def test_acquire_with_a_timeout_waits_only_when_it_fits(clock: FakeClock) -> None:
    """With a timeout, a wait that fits is waited (True); one that would outlast it is
    not started (False), and no token is taken."""
    bucket = TokenBucket(rate=1.0, capacity=5, clock=clock, sleep=clock.auto_sleep,
                         sleep_sync=clock.sleep)
    await drain(bucket)
    assert await bucket.acquire(2, timeout=1.5) is False
    assert bucket.acquire_sync(2, timeout=1.5) is False
    assert clock.sleeps == []
    assert bucket.waiting == 0
    assert await bucket.acquire(2, timeout=2.0) is True
    assert clock.sleeps == [2.0]
    assert bucket.acquire_sync(1, timeout=5) is True
    assert bucket.acquire_sync(1) is True


async def test_a_pause_beyond_the_timeout_gives_up_at_once(clock: FakeClock) -> None:
    """An adaptive bucket paused for 30 s answers a 10 s timeout with False at once."""
    bucket = TokenBucket(rate=1.0, capacity=5, adaptive=True, clock=clock,
                         sleep=clock.auto_sleep)
    bucket.update(0, 30.0)
    assert await bucket.acquire(timeout=10.0) is False
    assert clock.sleeps == []
    assert await bucket.acquire(timeout=31.0) is True
    assert clock.sleeps == [pytest.approx(31.0)]  # the pause, then a token's refill


async def test_behind_others_a_timeout_counts_their_tokens(clock: FakeClock) -> None:
    """A caller behind others gives up at once when their tokens and its own would not
    be there in time; within it, it waits its turn; either way the others keep theirs."""
    bucket = parked(clock)
    await drain(bucket)
    first = asyncio.create_task(bucket.acquire(3))
    await settle()
    assert await bucket.acquire(3, timeout=5.0) is False  # 3 + 3 tokens: 6 s
    assert bucket.waiting == 1
    second = asyncio.create_task(bucket.acquire(2, timeout=5.0))  # 3 + 2: 5 s, fits
    await settle()
    await clock.advance(3)
    assert first.done()
    await clock.advance(2)
    assert await second is True
    assert bucket.waiting == 0


async def test_a_pause_that_begins_while_waiting_gives_up_by_the_deadline(
        clock: FakeClock) -> None:
    """A server's pause that starts while the caller waits is looked at again: past the
    deadline, the caller leaves the queue instead of waiting on."""
    bucket = TokenBucket(rate=1.0, capacity=5, adaptive=True, clock=clock,
                         sleep=clock.parked_sleep)
    await drain(bucket)
    waiting = asyncio.create_task(bucket.acquire(1, timeout=3.0))
    await settle()
    bucket.update(0, 60.0)
    await clock.advance(1)
    assert await waiting is False
    assert bucket.waiting == 0


def test_acquire_sync_behind_a_thread_with_a_timeout() -> None:
    """Threads: a caller behind another waits for its turn within its timeout."""
    bucket = TokenBucket(rate=20.0, capacity=1)
    bucket.acquire_sync()
    results: list[bool] = []
    ahead = threading.Thread(target=lambda: results.append(bucket.acquire_sync(1)))
    ahead.start()
    while bucket.waiting == 0 and ahead.is_alive():
        pass
    assert bucket.acquire_sync(1, timeout=0.001) is False
    assert bucket.acquire_sync(1, timeout=2.0) is True
    ahead.join()
    assert results == [True]


async def test_a_caller_behind_others_at_its_deadline_gives_up(clock: FakeClock) -> None:
    """Behind a first waiter whose tokens are there but who has not run yet, a caller
    out of time gets False and leaves the queue: told to wait 0, it took itself for
    served, stayed queued, and stalled everyone once it came first."""
    bucket = parked(clock, rate=1.0, capacity=2.0)
    await drain(bucket)
    first = asyncio.create_task(bucket.acquire(1))
    await settle()
    clock.move(2)  # its tokens are there; its sleep is not over yet
    assert await bucket.acquire(1, timeout=0) is False
    assert bucket.waiting == 1
    await clock.advance(0)
    assert await first is True
    assert bucket.waiting == 0
    assert await asyncio.wait_for(bucket.acquire(1), 1.0) is True


def test_a_thread_that_moves_up_meanwhile_does_not_sleep_to_its_deadline(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A caller told to wait as one behind others, that comes first before it looks at
    the queue again, waits for its tokens, not for its whole timeout (which held up
    everyone behind it too)."""
    take = TokenBucket._try_take
    ahead_done = threading.Event()
    held_up: list[bool] = []

    def try_take(self: TokenBucket, waiter: object, deadline: float | None = None) -> object:
        answer = take(self, waiter, deadline)  # type: ignore[arg-type]
        if (threading.current_thread().name == "behind" and not held_up
                and deadline is not None and self._waiters[0] is not waiter):
            held_up.append(True)
            ahead_done.wait(5)  # the one ahead takes its tokens meanwhile
        return answer

    monkeypatch.setattr(TokenBucket, "_try_take", try_take)
    bucket = TokenBucket(rate=10.0, capacity=1)
    bucket.acquire_sync()
    took: dict[str, float] = {}
    start = time.monotonic()

    def run(name: str, timeout: float | None) -> None:
        bucket.acquire_sync(1, timeout=timeout)
        took[name] = time.monotonic() - start
        if name == "ahead":
            ahead_done.set()

    ahead = threading.Thread(target=run, args=("ahead", None), name="ahead")
    ahead.start()
    while bucket.waiting == 0:
        time.sleep(0.001)
    behind = threading.Thread(target=run, args=("behind", 10.0), name="behind")
    behind.start()
    ahead.join(5)
    behind.join(15)
    assert held_up == [True]
    assert took["behind"] < 2.0, took

"""Quotas for external services (actions/quota.py): AIMD on overloads, the rate limit (on a fake clock), FIFO
order, waiters on two loops, cancellation at every point, and books that balance after a cancel storm."""

from __future__ import annotations

import asyncio
import random
import threading
import time

import pytest

from prorl_server.actions import QuotaConfig, QuotaRegistry, ServiceDisabled, ServiceQuota, Slot


class FakeTime:
    """A clock that moves only when the quota sleeps on it (or a test moves it)."""

    def __init__(self) -> None:
        self.now = 0.0

    def clock(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.now += seconds
        await asyncio.sleep(0)


class ManualTime:
    """A clock the test moves (`advance`); the quota's sleeps end when it passes their time."""

    def __init__(self) -> None:
        self.now = 0.0
        self._sleepers: list[tuple[float, asyncio.Future[None]]] = []

    def clock(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        future = asyncio.get_running_loop().create_future()
        self._sleepers.append((self.now + seconds, future))
        await future

    @property
    def sleeping(self) -> list[float]:
        """When the sleeps in progress end."""
        return [until for until, future in self._sleepers if not future.done()]

    def advance(self, to: float) -> None:
        self.now = to
        for until, future in self._sleepers:
            if until <= to and not future.done():
                future.set_result(None)
        self._sleepers = [(until, future) for until, future in self._sleepers if not future.done()]


async def take(quota: ServiceQuota) -> Slot:
    """Hold a slot outside an `async with` (tests release it with `give_back`)."""
    slot = quota.slot()
    await slot.__aenter__()
    return slot


async def give_back(slot: Slot, exc: BaseException | None = None) -> None:
    await slot.__aexit__(type(exc) if exc is not None else None, exc, None)


def assert_books_balance(quota: ServiceQuota) -> None:
    figures = quota.snapshot()
    assert (figures.in_use, figures.waiting) == (0, 0), figures
    assert figures.granted_total == figures.released_total, figures


# --- configuration ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("settings", "says"),
    [
        ({"max_concurrency": -1}, "max_concurrency must be >= 0"),
        ({"max_concurrency": 4, "min_concurrency": 0}, "min_concurrency must be between 1 and max_concurrency"),
        ({"max_concurrency": 4, "min_concurrency": 5}, "min_concurrency must be between 1 and max_concurrency"),
        ({"backoff": 1.0}, "backoff must be between 0 and 1"),
        ({"backoff": 0}, "backoff must be between 0 and 1"),
        ({"rate_per_s": 0}, "rate_per_s must be a positive number"),
        ({"rate_per_s": float("inf")}, "rate_per_s must be a positive number"),
        ({"burst": 3}, "given only with rate_per_s"),
        ({"rate_per_s": 2, "burst": 0}, "burst must be >= 1"),
        ({"max_pause_s": -1}, "max_pause_s must be >= 0"),
    ],
)
def test_bad_config_is_refused_saying_what_is_wrong(settings, says):
    with pytest.raises(ValueError, match=says):
        QuotaConfig(**settings)


async def test_a_service_with_a_limit_of_0_refuses_every_call_clearly():
    with pytest.raises(ValueError, match="needs a name"):
        ServiceQuota("")
    off = ServiceQuota("search", QuotaConfig(max_concurrency=0))
    with pytest.raises(ServiceDisabled, match="service 'search' has a concurrency limit of 0"):
        async with off.slot():
            pass
    assert_books_balance(off)


async def test_a_slot_is_used_once_and_reports_only_while_held():
    quota = ServiceQuota("api")
    slot = quota.slot()
    with pytest.raises(RuntimeError, match="inside"):
        slot.overloaded()
    async with slot:
        pass
    with pytest.raises(RuntimeError, match="used once"):
        async with slot:
            pass


# --- AIMD ---------------------------------------------------------------------------------------------------


async def test_overloads_cut_the_limit_once_per_wave_down_to_the_minimum():
    quota = ServiceQuota("api", QuotaConfig(max_concurrency=8, min_concurrency=2))
    wave = [await take(quota) for _ in range(8)]
    for slot in wave[:3]:  # three 429s from the requests of one wave: one cut
        slot.overloaded()
    figures = quota.snapshot()
    assert (figures.limit, figures.overloads_total, figures.backoffs_total) == (4, 3, 1)
    for slot in wave:
        await give_back(slot, None if slot in wave[:3] else ConnectionError("neither success nor overload"))
    assert quota.limit == 4  # a reported overload is not also a success; a plain failure moves nothing

    async with quota.slot() as slot:  # a slot of the new wave: its overload cuts again
        slot.overloaded()
    assert quota.limit == 2
    with pytest.raises(TimeoutError):
        async with quota.slot():  # a timeout inside the block is an overload too
            raise TimeoutError
    figures = quota.snapshot()
    assert (figures.limit, figures.overloads_total, figures.backoffs_total) == (2, 5, 3)  # floored at the minimum
    assert_books_balance(quota)


async def test_successes_grow_the_limit_by_one_per_window_up_to_the_maximum():
    quota = ServiceQuota("api", QuotaConfig(max_concurrency=6))
    async with quota.slot() as slot:
        slot.overloaded()
    async with quota.slot() as slot:
        slot.overloaded()
    async with quota.slot() as slot:
        slot.overloaded()
    assert quota.limit == 1  # 6 -> 3 -> 1 -> 1

    limits = []
    for _ in range(25):
        async with quota.slot():
            pass
        limits.append(quota.limit)
    # one more after a window of successes, a window being the limit: 1, then 2, 3, 4, 5 successes
    expected = [2] + [2, 3] + [3, 3, 4] + [4] * 3 + [5] + [5] * 4 + [6]
    assert limits[: len(expected)] == expected
    assert set(limits[len(expected) :]) == {6}  # never past the maximum
    assert_books_balance(quota)


# --- order, loops, rate --------------------------------------------------------------------------------


async def test_waiters_are_served_first_come_first_served():
    quota = ServiceQuota("api", QuotaConfig(max_concurrency=1))
    holder = await take(quota)
    served: list[int] = []

    async def call(i: int) -> None:
        async with quota.slot():
            served.append(i)
            await asyncio.sleep(0)

    tasks = [asyncio.create_task(call(i)) for i in range(20)]
    await asyncio.sleep(0)
    assert quota.waiting == 20
    late = asyncio.create_task(call(99))  # arriving as the slot is handed on: behind them all
    await give_back(holder)
    await asyncio.gather(*tasks, late)
    assert served == [*range(20), 99]
    assert_books_balance(quota)


def test_waiters_on_two_event_loops_in_two_threads_are_all_served_within_the_limit():
    quota = ServiceQuota("api", QuotaConfig(max_concurrency=3))
    lock = threading.Lock()
    holding = peak = 0
    served = [0, 0]
    errors: list[BaseException] = []

    async def calls(which: int) -> None:
        nonlocal holding, peak
        rng = random.Random(which)
        for _ in range(300):
            async with quota.slot():
                with lock:
                    holding += 1
                    peak = max(peak, holding)
                await asyncio.sleep(rng.choice((0, 0, 0.0005)))
                with lock:
                    holding -= 1
                served[which] += 1

    def run(which: int) -> None:
        try:
            asyncio.run(calls(which))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not errors and not any(t.is_alive() for t in threads)
    assert served == [300, 300]
    assert 1 < peak <= 3
    assert_books_balance(quota)


async def test_the_rate_limit_spaces_grants_by_one_over_the_rate_after_the_burst():
    fake = FakeTime()
    quota = ServiceQuota(
        "api", QuotaConfig(max_concurrency=100, rate_per_s=4, burst=2), clock=fake.clock, sleep=fake.sleep
    )
    granted: list[tuple[int, float]] = []

    async def call(i: int) -> None:
        async with quota.slot():
            granted.append((i, fake.now))

    await asyncio.gather(*(call(i) for i in range(10)))
    assert [i for i, _ in granted] == list(range(10))
    assert [at for _, at in granted] == pytest.approx([0, 0, 0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 1.75, 2.0])
    figures = quota.snapshot()
    assert figures.queue_wait_mean_s == pytest.approx(sum(at for _, at in granted) / 10)
    assert figures.queue_wait_p95_s == pytest.approx(2.0)
    assert_books_balance(quota)


async def test_retry_after_pauses_new_grants_for_that_long_at_most_max_pause():
    fake = FakeTime()
    quota = ServiceQuota("api", QuotaConfig(max_concurrency=4, max_pause_s=30), clock=fake.clock, sleep=fake.sleep)
    async with quota.slot() as slot:
        slot.overloaded(retry_after_s=5)
    assert quota.snapshot().paused_s == pytest.approx(5)
    async with quota.slot():
        assert fake.now == pytest.approx(5)
    async with quota.slot() as slot:
        slot.overloaded(retry_after_s=3600)
    async with quota.slot():
        assert fake.now == pytest.approx(35)
    assert_books_balance(quota)


# --- cancellation ---------------------------------------------------------------------------------------


async def test_a_waiter_cancelled_in_line_leaves_it_holding_nothing():
    quota = ServiceQuota("api", QuotaConfig(max_concurrency=1))
    holder = await take(quota)
    waiter = asyncio.create_task(take(quota))
    await asyncio.sleep(0)
    assert (quota.in_use, quota.waiting) == (1, 1)
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert (quota.in_use, quota.waiting) == (1, 0)
    await give_back(holder)
    assert_books_balance(quota)


@pytest.mark.parametrize("delivered", [False, True], ids=["on-its-way", "delivered-not-resumed"])
async def test_a_slot_handed_to_a_cancelled_waiter_is_passed_on(delivered):
    quota = ServiceQuota("api", QuotaConfig(max_concurrency=1))
    holder = await take(quota)
    first = asyncio.create_task(take(quota))
    second = asyncio.create_task(take(quota))
    await asyncio.sleep(0)
    await give_back(holder)  # the slot is now on its way to `first` (call_soon_threadsafe)
    if delivered:
        await asyncio.sleep(0)  # handed over; `first` is woken but has not run yet
    first.cancel()
    slot = await asyncio.wait_for(second, 10)
    with pytest.raises(asyncio.CancelledError):
        await first
    assert (quota.in_use, quota.waiting) == (1, 0)
    await give_back(slot)
    figures = quota.snapshot()
    assert (figures.granted_total, figures.released_total) == (3, 3)
    assert_books_balance(quota)


async def test_a_holder_cancelled_inside_the_block_returns_its_slot_without_moving_the_limit():
    quota = ServiceQuota("api", QuotaConfig(max_concurrency=2))
    inside = asyncio.Event()

    async def call() -> None:
        async with quota.slot():
            inside.set()
            await asyncio.sleep(3600)

    task = asyncio.create_task(call())
    await inside.wait()
    assert quota.in_use == 1
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert quota.limit == 2
    assert_books_balance(quota)


async def test_the_head_timing_a_token_cancelled_hands_the_timing_on():
    manual = ManualTime()
    quota = ServiceQuota(
        "api", QuotaConfig(max_concurrency=4, rate_per_s=1, burst=1), clock=manual.clock, sleep=manual.sleep
    )
    async with quota.slot():  # the one token; the next is due at t=1
        pass
    head = asyncio.create_task(take(quota))
    behind = asyncio.create_task(take(quota))
    while manual.sleeping != [1.0]:  # the head alone times the token
        await asyncio.sleep(0)
    head.cancel()
    with pytest.raises(asyncio.CancelledError):
        await head
    while manual.sleeping != [1.0]:  # now the next in line does
        await asyncio.sleep(0)
    manual.advance(1.0)
    slot = await asyncio.wait_for(behind, 10)
    await give_back(slot)
    assert_books_balance(quota)


def storm(quota: ServiceQuota, seed: int, calls: int) -> int:
    """`calls` callers on a new loop, about half cancelled at random (in line, holding, being handed a slot),
    some reporting overloads; returns how many were cancelled."""

    async def caller(rng: random.Random) -> None:
        async with quota.slot() as slot:
            for _ in range(rng.randrange(5)):
                await asyncio.sleep(0)
            if rng.random() < 0.05:
                slot.overloaded(retry_after_s=rng.choice((None, 0.01)))

    async def main() -> int:
        rng = random.Random(seed)
        tasks = [asyncio.create_task(caller(random.Random(rng.random()))) for _ in range(calls)]
        live = list(tasks)
        while live:
            if rng.random() < 0.5:  # callers are served in order: the first live ones hold or are next in line
                live[rng.randrange(min(len(live), 12) if rng.random() < 0.5 else len(live))].cancel()
            await asyncio.sleep(rng.choice((0, 0, 0.0002)))
            live = [task for task in live if not task.done()]
        results = await asyncio.gather(*tasks, return_exceptions=True)
        odd = [r for r in results if not (r is None or isinstance(r, asyncio.CancelledError))]
        assert not odd, odd
        return sum(isinstance(r, asyncio.CancelledError) for r in results)

    return asyncio.run(main())


def test_the_books_balance_after_thousands_of_random_cancels_on_one_loop_with_a_rate_limit():
    fake = FakeTime()
    quota = ServiceQuota(
        "api",
        QuotaConfig(max_concurrency=6, rate_per_s=500, burst=4, max_pause_s=0.02),
        clock=fake.clock,
        sleep=fake.sleep,
    )
    cancelled = storm(quota, seed=7, calls=8000)
    assert cancelled > 1500
    figures = quota.snapshot()
    assert figures.granted_total > 1000 and figures.overloads_total > 0
    assert_books_balance(quota)
    assert 1 <= figures.limit <= 6


def test_the_books_balance_after_random_cancels_on_two_loops_in_two_threads():
    quota = ServiceQuota("api", QuotaConfig(max_concurrency=4, rate_per_s=20_000, burst=2, max_pause_s=0.001))
    cancelled: list[int] = []
    threads = [threading.Thread(target=lambda s=seed: cancelled.append(storm(quota, s, 4000))) for seed in (1, 2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert len(cancelled) == 2 and not any(t.is_alive() for t in threads)
    assert sum(cancelled) > 1500
    assert_books_balance(quota)


async def test_a_dead_loops_waiters_and_slots_are_taken_back():
    quota = ServiceQuota("api", QuotaConfig(max_concurrency=1))
    dead = asyncio.new_event_loop()
    holding = threading.Event()

    async def doomed() -> None:
        async with quota.slot():
            holding.set()
            await asyncio.sleep(3600)

    thread = threading.Thread(target=dead.run_forever)
    thread.start()
    asyncio.run_coroutine_threadsafe(doomed(), dead)
    assert holding.wait(10)
    mine = asyncio.create_task(take(quota))  # in line behind the dead loop's holder
    await asyncio.sleep(0)
    asyncio.run_coroutine_threadsafe(take(quota), dead)  # and one of the dead loop's, behind it
    deadline = time.monotonic() + 10
    while quota.waiting < 2 and time.monotonic() < deadline:
        await asyncio.sleep(0.001)
    dead.call_soon_threadsafe(dead.stop)  # the loop dies with its tasks inside
    thread.join(10)

    quota.abandon_loop(dead)
    slot = await asyncio.wait_for(mine, 10)
    assert (quota.in_use, quota.waiting) == (1, 0)

    async def unwind() -> None:  # were the dead loop's tasks to unwind after all, they would move nothing
        tasks = asyncio.all_tasks() - {asyncio.current_task()}
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    thread = threading.Thread(target=dead.run_until_complete, args=(unwind(),))
    thread.start()
    thread.join(10)
    dead.close()
    assert (quota.in_use, quota.waiting) == (1, 0)
    await give_back(slot)
    assert_books_balance(quota)


# --- registry, cost -----------------------------------------------------------------------------------


async def test_the_registry_creates_services_on_first_use_and_configures_them_before():
    registry = QuotaRegistry(QuotaConfig(max_concurrency=4))
    search = registry.configure("search", QuotaConfig(max_concurrency=2, rate_per_s=10))
    assert registry.get("search") is search and search.limit == 2
    judge = registry.get("judge")
    assert judge.limit == 4 and registry.get("judge") is judge
    with pytest.raises(ValueError, match="service 'judge' already has a quota"):
        registry.configure("judge", QuotaConfig())
    async with judge.slot():
        figures = registry.snapshot()
    assert set(figures) == {"search", "judge"}
    assert (figures["judge"].in_use, figures["judge"].granted_total) == (1, 1)
    assert (figures["search"].rate_per_s, figures["search"].max_concurrency) == (10, 2)


async def test_scheduling_a_call_costs_well_under_a_millisecond():
    quota = ServiceQuota("api", QuotaConfig(max_concurrency=4, rate_per_s=1e9))
    rounds = 20_000
    started = time.perf_counter()
    for _ in range(rounds):
        async with quota.slot():
            pass
    per_call = (time.perf_counter() - started) / rounds
    assert per_call < 5e-4, f"{per_call * 1e6:.1f} µs per uncontended slot"  # ~100x the cost measured
    assert_books_balance(quota)

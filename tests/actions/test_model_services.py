"""Model services under a memory budget (actions/model_services.py), on a fake launcher: hits and restores, LRU
eviction of idle services only, first come first served, shared use, refusals, failed starts, cancellation at
every point, users on two event loops, and books that balance after thousands of random cancels."""

from __future__ import annotations

import asyncio
import random
import threading
import time

import pytest

from prorl_server.actions import (
    ModelServiceCache,
    ModelServiceRefused,
    ModelServiceUnavailable,
    ServiceLauncher,
    ServiceState,
)

MB = 100


class FakeHost:
    """The machine the fake services run on: which are alive, and that they never hold more than the budget."""

    def __init__(self, budget_mb: int) -> None:
        self.budget_mb = budget_mb
        self.alive: dict[str, int] = {}
        self.starts: list[str] = []
        self.stops: list[str] = []
        self._lock = threading.Lock()

    def up(self, name: str, memory_mb: int) -> None:
        with self._lock:
            assert name not in self.alive, f"{name} started twice"
            self.alive[name] = memory_mb
            assert sum(self.alive.values()) <= self.budget_mb, f"over the budget: {self.alive}"
            self.starts.append(name)

    def down(self, name: str) -> None:
        with self._lock:
            assert self.alive.pop(name, None) is not None, f"{name} stopped while not running"
            self.stops.append(name)


class FakeLauncher(ServiceLauncher):
    """A test double of a model process: it 'starts' after `start_s` by going alive on the fake host (or fails,
    when told to), and 'stops' by going away."""

    def __init__(self, host: FakeHost, name: str, memory_mb: int, start_s: float = 0.0) -> None:
        self.host = host
        self.name = name
        self.memory_mb = memory_mb
        self.start_s = start_s
        self.failures = 0  # starts still to fail
        self.started = threading.Event()

    def start(self) -> str:
        self.started.set()
        time.sleep(self.start_s() if callable(self.start_s) else self.start_s)
        if self.failures:
            self.failures -= 1
            raise RuntimeError("weights file missing")
        self.host.up(self.name, self.memory_mb)
        return f"http://fake/{self.name}/v1"

    def stop(self) -> None:
        self.host.down(self.name)


def make_cache(budget_mb: int, services: dict[str, int], start_s=0.0) -> tuple[ModelServiceCache, FakeHost, dict]:
    host = FakeHost(budget_mb)
    cache = ModelServiceCache(budget_mb)
    launchers = {}
    for name, memory_mb in services.items():
        launchers[name] = FakeLauncher(host, name, memory_mb, start_s)
        cache.register(name, memory_mb, launchers[name])
    return cache, host, launchers


def states(cache: ModelServiceCache) -> dict[str, ServiceState]:
    return {s.name: s.state for s in cache.snapshot().services}


async def until(condition, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.002)


def assert_books_balance(cache: ModelServiceCache, host: FakeHost) -> None:
    figures = cache.snapshot()
    assert (figures.executing, figures.waiting) == (0, 0), figures
    assert figures.resident_mb == sum(host.alive.values()) <= figures.budget_mb, (figures, host.alive)
    assert {s.name for s in figures.services if s.state is ServiceState.RESIDENT} == set(host.alive)
    assert figures.restores == len(host.starts)
    assert figures.restores - figures.evictions == len(host.alive)


# --- hits, restores, eviction -----------------------------------------------------------------------------------


async def _use_once(cache: ModelServiceCache, name: str, order: list[str] | None = None) -> str:
    async with cache.use(name) as endpoint:
        if order is not None:
            order.append(name)
        return endpoint


async def hold(cache: ModelServiceCache, name: str) -> tuple[asyncio.Task, asyncio.Event]:
    """A task executing on `name` (returned once it does) until the returned event is set."""
    release = asyncio.Event()
    inside = asyncio.Event()  # not `executing == 1`: a use waiting for its restore counts as executing too

    async def use() -> None:
        async with cache.use(name):
            inside.set()
            await release.wait()

    holder = asyncio.create_task(use())
    await inside.wait()
    return holder, release


async def test_a_resident_service_is_a_hit_and_an_absent_one_is_restored():
    cache, host, _ = make_cache(2 * MB, {"judge-a": MB})
    async with cache.use("judge-a") as endpoint:
        assert endpoint == "http://fake/judge-a/v1"
        assert cache.snapshot().executing == 1
    async with cache.use("judge-a"):
        pass
    figures = cache.snapshot()
    assert (figures.hits, figures.misses, figures.restores, figures.evictions) == (1, 1, 1, 0)
    assert figures.resident_mb == MB and states(cache) == {"judge-a": ServiceState.RESIDENT}  # cached after use
    assert_books_balance(cache, host)


async def test_idle_services_are_evicted_least_recently_used_first():
    cache, host, _ = make_cache(2 * MB, {name: MB for name in "ABCD"})
    for name in "ABCB":
        async with cache.use(name):
            pass
    assert host.stops == ["A"]  # C needed room: A was the least recently used
    async with cache.use("D"):
        pass
    assert host.stops == ["A", "C"]  # B was used after C
    figures = cache.snapshot()
    assert (figures.hits, figures.misses, figures.restores, figures.evictions) == (1, 4, 4, 2)
    assert [s.name for s in figures.services][-2:] == ["B", "D"]  # the LRU order, least recent first
    assert_books_balance(cache, host)


async def test_a_restore_evicts_several_small_services_for_a_large_one():
    cache, host, _ = make_cache(3 * MB, {"small-1": MB, "small-2": MB, "small-3": MB, "large": 3 * MB})
    for name in ("small-1", "small-2", "small-3", "large"):
        async with cache.use(name):
            pass
    assert host.stops == ["small-1", "small-2", "small-3"] and set(host.alive) == {"large"}
    assert_books_balance(cache, host)


async def test_restore_and_eviction_times_are_measured():
    cache, _, _ = make_cache(MB, {"A": MB, "B": MB}, start_s=0.05)
    for name in "AB":
        async with cache.use(name):
            pass
    figures = cache.snapshot()
    assert figures.restore_s_total >= 0.1 and figures.evictions == 1
    assert all(s.last_restore_s >= 0.05 and s.restores == 1 for s in figures.services)


# --- executing services, waiting, sharing -----------------------------------------------------------------------


async def test_an_executing_service_is_never_evicted_the_next_service_waits_for_it():
    cache, host, _ = make_cache(MB, {"A": MB, "B": MB})
    holder, a_done = await hold(cache, "A")
    assert "A" in host.alive
    waiter = asyncio.create_task(_use_once(cache, "B"))
    await until(lambda: cache.snapshot().waiting == 1)
    await asyncio.sleep(0.05)
    assert not waiter.done() and host.alive == {"A": MB}  # A executes: it stays
    a_done.set()
    assert await waiter == "http://fake/B/v1"
    await holder
    assert host.stops == ["A"]
    assert_books_balance(cache, host)


async def test_waiters_are_served_first_come_first_served_even_for_a_resident_service():
    cache, host, _ = make_cache(MB, {"A": MB, "B": MB})
    order: list[str] = []
    holder, release_a = await hold(cache, "A")
    wants_b = asyncio.create_task(_use_once(cache, "B", order))
    await until(lambda: cache.snapshot().waiting == 1)
    wants_a = asyncio.create_task(_use_once(cache, "A", order))  # A is resident, but B asked first
    await until(lambda: cache.snapshot().waiting == 2)
    await asyncio.sleep(0.02)
    assert not wants_a.done()
    release_a.set()
    await asyncio.gather(holder, wants_b, wants_a)
    assert order == ["B", "A"]
    assert host.starts == ["A", "B", "A"]
    assert_books_balance(cache, host)


async def test_concurrent_users_of_one_service_share_one_restore_and_one_process():
    cache, host, _ = make_cache(MB, {"A": MB}, start_s=0.05)
    both = asyncio.Event()
    count = 0

    async def user():
        nonlocal count
        async with cache.use("A"):
            count += 1
            if count == 2:  # both inside at once
                both.set()
            await both.wait()

    await asyncio.wait_for(asyncio.gather(user(), user()), 5)
    figures = cache.snapshot()
    assert host.starts == ["A"] and figures.restores == 1 and figures.misses == 2  # the second joined the restore
    assert_books_balance(cache, host)


# --- refusals and failures --------------------------------------------------------------------------------------


async def test_an_unknown_service_or_one_larger_than_the_budget_is_refused_at_once():
    cache, host, _ = make_cache(2 * MB, {"A": MB})
    with pytest.raises(ModelServiceRefused, match=r"needs 300 MiB and the budget is 200 MiB: raise the budget"):
        cache.register("huge", 3 * MB, FakeLauncher(host, "huge", 3 * MB))
    with pytest.raises(ModelServiceRefused, match=r"'nope' is not registered \(registered: A\)"):
        async with cache.use("nope"):
            pass
    with pytest.raises(ValueError, match="registered already"):
        cache.register("A", MB, FakeLauncher(host, "A", MB))
    with pytest.raises(ValueError, match=">= 1 MiB"):
        ModelServiceCache(0)
    figures = cache.snapshot()
    assert figures.refused == 1 and [s.name for s in figures.services] == ["A"]
    assert_books_balance(cache, host)


async def test_a_failed_start_fails_every_user_waiting_for_it_and_frees_its_memory():
    cache, host, launchers = make_cache(MB, {"A": MB}, start_s=0.05)
    launchers["A"].failures = 1
    results = await asyncio.gather(_use_once(cache, "A"), _use_once(cache, "A"), return_exceptions=True)
    for result in results:
        assert isinstance(result, ModelServiceUnavailable)
        assert "model service 'A' failed to start: weights file missing" in str(result)
    figures = cache.snapshot()
    assert (figures.start_failures, figures.resident_mb, figures.executing) == (1, 0, 0)
    assert await _use_once(cache, "A") == "http://fake/A/v1"  # the next use tries again
    assert_books_balance(cache, host)


# --- cancellation -----------------------------------------------------------------------------------------------


async def test_a_waiter_cancelled_in_line_leaves_it_holding_nothing():
    cache, host, _ = make_cache(MB, {"A": MB, "B": MB})
    holder, release_a = await hold(cache, "A")
    waiter = asyncio.create_task(_use_once(cache, "B"))
    await until(lambda: cache.snapshot().waiting == 1)
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert cache.snapshot().waiting == 0
    release_a.set()
    await holder
    assert host.starts == ["A"]  # B was never restored
    assert_books_balance(cache, host)


async def test_a_user_cancelled_during_its_restore_leaves_the_service_cached():
    cache, host, launchers = make_cache(MB, {"A": MB}, start_s=0.1)
    user = asyncio.create_task(_use_once(cache, "A"))
    await asyncio.to_thread(launchers["A"].started.wait, 5)
    user.cancel()
    with pytest.raises(asyncio.CancelledError):
        await user
    assert cache.snapshot().executing == 0
    await until(lambda: states(cache)["A"] is ServiceState.RESIDENT)
    async with cache.use("A"):
        pass
    figures = cache.snapshot()
    assert (figures.hits, figures.misses, figures.restores) == (1, 1, 1)
    assert_books_balance(cache, host)


async def test_a_holder_cancelled_inside_its_block_gives_the_service_back():
    cache, host, _ = make_cache(MB, {"A": MB, "B": MB})
    inside = asyncio.Event()

    async def hold():
        async with cache.use("A"):
            inside.set()
            await asyncio.sleep(60)

    holder = asyncio.create_task(hold())
    await inside.wait()
    holder.cancel()
    with pytest.raises(asyncio.CancelledError):
        await holder
    assert cache.snapshot().executing == 0
    await _use_once(cache, "B")  # A is idle: evicted
    assert host.stops == ["A"]
    assert_books_balance(cache, host)


# --- several event loops, cancel storms, closing ---------------------------------------------------------------


def run_loop_thread(body, *args) -> tuple[threading.Thread, list[BaseException]]:
    """Run `body(*args)` on a new event loop on its own thread; failures land in the returned list."""
    errors: list[BaseException] = []

    def main():
        try:
            asyncio.run(body(*args))
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=main, name="test-loop")
    thread.start()
    return thread, errors


async def test_users_on_two_event_loops_share_the_cache():
    cache, host, _ = make_cache(2 * MB, {name: MB for name in "ABC"})

    async def users(seed: int):
        rng = random.Random(seed)
        for _ in range(50):
            name = rng.choice("ABC")
            async with cache.use(name) as endpoint:
                assert endpoint == f"http://fake/{name}/v1" and name in host.alive
                await asyncio.sleep(rng.random() * 0.002)

    threads = [run_loop_thread(users, seed) for seed in (1, 2)]
    for thread, errors in threads:
        await asyncio.to_thread(thread.join, 30)
        assert not errors, errors
    figures = cache.snapshot()
    assert figures.hits + figures.misses == 100 and figures.restores >= 3
    assert_books_balance(cache, host)


async def test_books_balance_after_thousands_of_random_cancels():
    """5 services, room for 2, 3,000 uses on two loops; each use is cancelled at a random moment (in line, while
    its service is restored, inside its block) or runs to the end; restores take 0-2 ms."""
    rng = random.Random(22)
    services = {"A": MB, "B": MB, "C": MB, "D": 2 * MB, "E": MB}
    cache, host, launchers = make_cache(2 * MB, services, start_s=lambda: rng.random() * 0.002)
    finished = {"completed": 0, "cancelled": 0, "failed": 0}
    counts_lock = threading.Lock()
    for launcher in launchers.values():
        launcher.failures = 2  # a few failed starts in the mix

    async def one_use(name: str, hold_s: float) -> None:
        async with cache.use(name):
            assert name in host.alive, f"{name} executing but not running"
            await asyncio.sleep(hold_s)

    async def storm(seed: int) -> None:
        local = random.Random(seed)
        tasks = []
        for _ in range(1500):
            task = asyncio.create_task(one_use(local.choice("ABCDE"), local.random() * 0.001))
            tasks.append(task)
            if local.random() < 0.7:
                asyncio.get_running_loop().call_later(local.random() * 0.01, task.cancel)
            if local.random() < 0.1:
                await asyncio.sleep(local.random() * 0.002)
        for outcome in await asyncio.gather(*tasks, return_exceptions=True):
            kind = (
                "completed"
                if outcome is None
                else "cancelled"
                if isinstance(outcome, asyncio.CancelledError)
                else "failed"
            )
            if kind == "failed":
                assert isinstance(outcome, ModelServiceUnavailable), outcome
            with counts_lock:
                finished[kind] += 1

    threads = [run_loop_thread(storm, seed) for seed in (1, 2)]
    for thread, errors in threads:
        await asyncio.to_thread(thread.join, 120)
        assert not errors, errors
    figures = cache.snapshot()
    assert sum(finished.values()) == 3000
    assert finished["cancelled"] > 1000 and finished["completed"] > 100, finished
    assert figures.evictions > 10 and figures.start_failures == 10, figures
    assert_books_balance(cache, host)


async def test_a_dead_event_loop_is_abandoned_with_its_users():
    cache, host, _ = make_cache(MB, {"A": MB, "B": MB}, start_s=0.05)
    dead = asyncio.new_event_loop()
    tasks: list[asyncio.Task] = []

    async def hold_a():
        async with cache.use("A"):
            await asyncio.sleep(3600)

    def run_then_stop():  # one user holds A, one waits in line for B; then the loop stops running
        tasks.extend([dead.create_task(hold_a()), dead.create_task(_use_once(cache, "B"))])
        dead.run_until_complete(asyncio.sleep(0.3))

    def unwind_and_close():  # the dead loop's tasks unwind late: they must not count twice
        for task in tasks:
            task.cancel()
        dead.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
        dead.close()

    await asyncio.to_thread(run_then_stop)
    figures = cache.snapshot()
    assert (figures.executing, figures.waiting) == (1, 1)
    cache.abandon_loop(dead)
    assert (cache.snapshot().executing, cache.snapshot().waiting) == (0, 0)
    assert await _use_once(cache, "B") == "http://fake/B/v1"  # A is idle now: evicted
    await asyncio.to_thread(unwind_and_close)
    assert host.stops == ["A"]
    assert_books_balance(cache, host)


async def test_close_stops_every_service_and_fails_the_waiting_users():
    cache, host, _ = make_cache(MB, {"A": MB, "B": MB})
    holder, release_a = await hold(cache, "A")
    waiter = asyncio.create_task(_use_once(cache, "B"))
    await until(lambda: cache.snapshot().waiting == 1)
    await asyncio.to_thread(cache.close)
    with pytest.raises(ModelServiceUnavailable, match="the cache was closed"):
        await waiter
    assert host.alive == {} and host.stops == ["A"]
    release_a.set()
    await holder
    with pytest.raises(ModelServiceUnavailable, match="the cache was closed"):
        await _use_once(cache, "A")
    figures = cache.snapshot()
    assert (figures.executing, figures.waiting, figures.resident_mb, figures.evictions) == (0, 0, 0, 0)

"""The action scheduler (ARL-Tangram): duration models learned per kind, the elastic allocation of cores, and
the pool's books under waits, cancels and loops on other threads."""

from __future__ import annotations

import asyncio
import random
import threading

import pytest

from prorl_server.actions import ActionDemand, ActionRefused, ActionScheduler, AmdahlModel
from prorl_server.actions.allocation import Pending, Running, arrange, plan
from prorl_server.actions.scheduler import COMPLETION_BUCKETS, CORE_BUCKETS, MAX_KINDS, OTHER_KIND, QUEUE_BUCKETS


def amdahl(t1: float, serial: float):
    return lambda cores: t1 * (serial + (1 - serial) / cores)


def test_amdahl_model_learns_the_serial_fraction_from_several_dops():
    model = AmdahlModel()
    assert model.duration(4) is None
    truth = amdahl(10.0, 0.2)
    for dop in (1, 2, 4, 8, 2, 4):
        model.observe(dop, truth(dop))
    t1, serial = model.fit()
    assert t1 == pytest.approx(10.0, rel=1e-6) and serial == pytest.approx(0.2, abs=1e-6)
    assert model.duration(16) == pytest.approx(truth(16), rel=1e-6)


def test_amdahl_model_with_one_dop_keeps_its_prior_and_ignores_nonsense():
    model = AmdahlModel(prior_serial=0.5)
    for _ in range(3):
        model.observe(2, 3.0)  # T(2) = T1 * (0.5 + 0.25) = 3 -> T1 = 4
    model.observe(0, 1.0)
    model.observe(2, float("nan"))
    assert model.fit() == pytest.approx((4.0, 0.5))
    with pytest.raises(ValueError, match="prior_serial"):
        AmdahlModel(prior_serial=1.5)


def test_arrange_gives_each_core_where_it_shortens_most():
    parallel = Pending(1, 8, 0, 0.0, amdahl(8.0, 0.0))
    serial = Pending(1, 8, 0, 0.0, amdahl(8.0, 1.0))
    cores = arrange([parallel, serial], 6)
    assert cores == {parallel: 5, serial: 1}  # more cores never shorten a serial action


def test_plan_runs_parallel_actions_one_after_the_other_on_all_cores():
    # 4 cores, two fully parallel 8 s actions: both at 2 cores end at 4 s (ACT sum 8); one at 4 cores then the
    # other at 4 cores end at 2 s and 4 s (ACT sum 6): the eviction finds the better one
    first = Pending(1, 4, 0, 0.0, amdahl(8.0, 0.0))
    second = Pending(1, 4, 0, 0.0, amdahl(8.0, 0.0))
    assert plan([first, second], 4, 1024, [], now=0.0) == [(first, 4)]


def test_plan_runs_serial_actions_side_by_side():
    actions = [Pending(1, 4, 0, 0.0, amdahl(8.0, 1.0)) for _ in range(3)]
    assert plan(actions, 4, 1024, [], now=0.0) == [(a, 1) for a in actions]


def test_plan_starts_fixed_and_unknown_actions_with_their_minimum_and_respects_fcfs_and_memory():
    fixed = Pending(2, 2, 100, 0.0, amdahl(1.0, 0.0))
    unknown = Pending(1, 8, 100, 0.0, None)
    big = Pending(1, 1, 900, 0.0, None)  # does not fit the memory left: it and everything behind it wait
    behind = Pending(1, 1, 0, 0.0, None)
    decided = plan([fixed, unknown, big, behind], 8, 1000, [Running(5.0, 0)], now=0.0)
    assert decided == [(fixed, 2), (unknown, 1)]


def test_an_action_that_can_never_fit_is_refused_at_once():
    scheduler = ActionScheduler(cpus=4, memory_mb=1024)

    async def ask(demand: ActionDemand) -> None:
        await scheduler.acquire(demand)

    for demand, words in [
        (ActionDemand("test", cpu=(8, 8)), "at least 8 cores and the pool has 4"),
        (ActionDemand("test", memory_mb=4096), "4096 MiB and the pool has 1024"),
        (ActionDemand("test", cpu=(0, 2)), "minimum >= 1"),
        (ActionDemand("test", cpu=(3, 2)), "maximum >= minimum"),
    ]:
        with pytest.raises(ActionRefused, match=words):
            asyncio.run(ask(demand))
    assert scheduler.books().refused_total == 4


async def test_actions_queue_first_come_first_served_and_learn_their_durations():
    clock = [0.0]
    scheduler = ActionScheduler(cpus=2, memory_mb=1024, clock=lambda: clock[0])
    order: list[int] = []

    async def one(i: int) -> None:
        async with scheduler.action(ActionDemand("bash")) as grant:
            order.append(i)
            assert grant.cpu == 1
            await asyncio.sleep(0)
            clock[0] += 1.0

    await asyncio.gather(*(one(i) for i in range(6)))
    assert order == list(range(6))
    books = scheduler.books()
    assert (books.free_cpu, books.running, books.waiting) == (2, 0, 0)
    assert books.granted_total == books.released_total == 6
    assert scheduler.models["bash"].observations == 6


async def test_a_scalable_action_gets_the_free_cores_and_its_dop_range_caps_them():
    scheduler = ActionScheduler(cpus=8, memory_mb=1024)
    for dop in (1, 2, 4):
        scheduler.models["pytest"].observe(dop, amdahl(8.0, 0.05)(dop))
    async with scheduler.action(ActionDemand("pytest", cpu=(1, 6))) as grant:
        assert grant.cpu == 6
    async with scheduler.action(ActionDemand("pytest", cpu=(1, 64))) as grant:
        assert grant.cpu == 8  # a maximum above the pool is the pool


def test_waiters_on_other_loops_and_threads_get_their_grants():
    scheduler = ActionScheduler(cpus=1, memory_mb=0)
    done: list[str] = []

    def worker(name: str) -> None:
        async def run() -> None:
            for _ in range(50):
                async with scheduler.action(ActionDemand("bash")):
                    await asyncio.sleep(0)
            done.append(name)

        asyncio.run(run())

    threads = [threading.Thread(target=worker, args=(f"t{i}",)) for i in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert sorted(done) == ["t0", "t1", "t2"]
    books = scheduler.books()
    assert books.free_cpu == 1 and books.granted_total == books.released_total == 150


async def test_thousands_of_random_cancels_leave_the_books_balanced():
    rng = random.Random(22)
    scheduler = ActionScheduler(cpus=4, memory_mb=4096)
    for dop in (1, 2, 4):
        scheduler.models["tests"].observe(dop, amdahl(0.01, 0.2)(dop))

    async def action(i: int) -> None:
        demand = ActionDemand("tests", cpu=(1, 4), memory_mb=rng.choice((0, 512))) if i % 2 else ActionDemand("bash")
        async with scheduler.action(demand):
            await asyncio.sleep(rng.random() * 0.002)

    tasks = [asyncio.ensure_future(action(i)) for i in range(3000)]
    for _ in range(2000):
        await asyncio.sleep(0)
        victim = rng.choice(tasks)
        victim.cancel()
    results = await asyncio.gather(*tasks, return_exceptions=True)
    assert all(r is None or isinstance(r, asyncio.CancelledError) for r in results)
    assert sum(isinstance(r, asyncio.CancelledError) for r in results) > 500
    books = scheduler.books()
    assert (books.free_cpu, books.free_memory_mb, books.waiting, books.running) == (4, 4096, 0, 0)
    assert books.granted_total == books.released_total


async def test_per_kind_statistics_count_queueing_cores_completion_and_refusals():
    clock = [0.0]
    scheduler = ActionScheduler(cpus=2, memory_mb=0, clock=lambda: clock[0])
    first = await scheduler.acquire(ActionDemand("tests", cpu=(2, 2)))
    queued = asyncio.ensure_future(scheduler.acquire(ActionDemand("bash")))
    await asyncio.sleep(0)
    clock[0] = 3.0
    assert scheduler.books().busy_core_s == 6.0  # 2 cores for 3 s, the running action included
    scheduler.release(first)  # tests: ACT 3 s (no queueing); the bash waiter starts after 3 s in the queue
    second = await queued
    assert second.queued_s == 3.0
    clock[0] = 4.5
    scheduler.release(second)  # bash: ACT 3 + 1.5 s
    cancelled = await scheduler.acquire(ActionDemand("bash"))
    clock[0] = 5.0
    scheduler.release(cancelled, completed=False)  # no completion time
    with pytest.raises(ActionRefused):
        await scheduler.acquire(ActionDemand("bash", cpu=(3, 3)))

    stats = scheduler.kind_stats()
    assert set(stats) == {"tests", "bash"}
    tests, bash = stats["tests"], stats["bash"]
    assert (tests.granted, tests.refused, bash.granted, bash.refused) == (1, 0, 2, 1)
    assert (tests.completion_s.count, tests.completion_s.sum) == (1, 3.0)
    assert (bash.completion_s.count, bash.completion_s.mean) == (1, 4.5)
    assert (bash.queue_s.count, bash.queue_s.sum, bash.queue_s.mean) == (2, 3.0, 1.5)
    assert (tests.cores.mean, bash.cores.mean) == (2.0, 1.0)
    # buckets: 3 s is above 2.5 and at most 5; 0 s is in the first queue bucket; 2 cores at most 2
    assert tests.completion_s.counts[COMPLETION_BUCKETS.index(5.0)] == 1
    assert bash.queue_s.counts[0] == 1 and bash.queue_s.counts[QUEUE_BUCKETS.index(5.0)] == 1
    assert tests.cores.counts[CORE_BUCKETS.index(2.0)] == 1 and len(tests.cores.counts) == len(CORE_BUCKETS) + 1
    assert scheduler.books().busy_core_s == 6.0 + 1.5 + 0.5  # bash 1 core from 3 to 4.5 s, the cancelled one 4.5 to 5 s
    clock[0] = 10.0
    assert scheduler.books().busy_core_s == 8.0  # nothing busy since
    assert ActionScheduler(cpus=1, memory_mb=0).kind_stats() == {}


async def test_kinds_past_the_bound_are_counted_as_other():
    scheduler = ActionScheduler(cpus=1, memory_mb=0)
    for i in range(MAX_KINDS + 3):
        async with scheduler.action(ActionDemand(f"kind-{i}")):
            pass
    stats = scheduler.kind_stats()
    assert len(stats) == MAX_KINDS + 1
    assert stats[OTHER_KIND].granted == stats[OTHER_KIND].completion_s.count == 3
    assert f"kind-{MAX_KINDS - 1}" in stats and f"kind-{MAX_KINDS}" not in stats

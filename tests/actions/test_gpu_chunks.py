"""The simulated GPU manager (actions/gpu_chunks.py): aligned chunks split and merged like buddies, a chunk that
caches the service preferred, LRU eviction of the copies on a chunk's GPUs, restore time from the PCIe rate, and
a replayed trace (first come, first served, one action per GPU)."""

from __future__ import annotations

import random

import pytest

from prorl_server.actions import Call, Chunk, GpuChunkManager, GpuService, simulate


def node(gpus: int = 8, memory_gb: float = 80.0, *services: GpuService) -> GpuChunkManager:
    manager = GpuChunkManager(gpus, memory_gb, pcie_gb_per_s=20.0)
    for service in services:
        manager.register(service)
    return manager


def test_chunks_are_aligned_split_from_the_smallest_free_level_and_merged_back():
    manager = node(8, 80.0, GpuService("one", 1, 2), GpuService("two", 2, 4), GpuService("four", 4, 8))
    one = manager.acquire("one")
    assert one.chunk == Chunk(0, 1)
    assert manager.free_chunks == [Chunk(1, 1), Chunk(2, 2), Chunk(4, 4)]
    four = manager.acquire("four")
    two = manager.acquire("two")
    assert (four.chunk, two.chunk) == (Chunk(4, 4), Chunk(2, 2))  # each from the smallest level that holds it
    assert manager.free_chunks == [Chunk(1, 1)]
    assert manager.acquire("two") is None  # 1 GPU free, not 2: the action waits
    for placement in (one, two, four):
        manager.release(placement)
    assert manager.free_chunks == [Chunk(0, 8)]


def test_a_chunk_that_caches_the_service_is_preferred_and_is_a_hit():
    manager = node(4, 80.0, GpuService("judge", 1, 10), GpuService("other", 1, 10))
    first = [manager.acquire("other"), manager.acquire("judge")]
    assert [p.chunk for p in first] == [Chunk(0, 1), Chunk(1, 1)]
    for placement in first:
        manager.release(placement)
    assert manager.free_chunks == [Chunk(0, 4)]
    again = manager.acquire("judge")  # the whole node is free: split toward GPU 1, where judge is cached
    assert (again.chunk, again.restored, again.restore_s) == (Chunk(1, 1), False, 0.0)
    assert (manager.hits, manager.restores) == (1, 2)


def test_restore_takes_the_per_gpu_share_over_the_pcie_rate():
    manager = node(8, 80.0, GpuService("rm-70b", 4, 140.0))
    placement = manager.acquire("rm-70b")
    assert placement.restored and placement.restore_s == pytest.approx(35.0 / 20.0)  # 35 GB per GPU at 20 GB/s
    assert all(manager.used_gb(gpu) == pytest.approx(35.0) for gpu in range(4))
    assert manager.restore_s_total == pytest.approx(1.75)


def test_copies_on_the_chunk_are_evicted_least_recently_used_until_the_service_fits():
    manager = node(1, 80.0, GpuService("a", 1, 30), GpuService("b", 1, 30), GpuService("c", 1, 30))
    for name in ("a", "b", "a", "c"):  # a and b fit; c needs room and b is the least recently used
        placement = manager.acquire(name)
        manager.release(placement)
    assert placement.evicted == ("b",)
    assert [name for name, _ in manager.resident] == ["a", "c"]
    assert manager.used_gb(0) == pytest.approx(60.0)
    assert (manager.hits, manager.restores, manager.evictions) == (1, 3, 1)


def test_a_large_service_evicts_the_copies_on_each_of_its_gpus_and_no_others():
    small = [GpuService(f"s{i}", 1, 50) for i in range(4)]
    manager = node(4, 80.0, *small, GpuService("big", 2, 100))
    for service in small:
        manager.release(manager.acquire(service.name))
    placement = manager.acquire("big")  # 50 GB per GPU: both small copies on its chunk go
    assert placement.chunk == Chunk(0, 2) and sorted(placement.evicted) == ["s0", "s1"]
    assert {name for name, _ in manager.resident} == {"s2", "s3", "big"}


def test_services_that_cannot_be_placed_are_refused_at_registration():
    manager = node(4, 80.0)
    with pytest.raises(ValueError, match="DoP 3 is not a chunk size"):
        manager.register(GpuService("odd", 3, 10))
    with pytest.raises(ValueError, match="DoP 8 is not a chunk size of a 4-GPU node"):
        manager.register(GpuService("wide", 8, 10))
    with pytest.raises(ValueError, match="needs 90 GB per GPU and a GPU has 80 GB: give it a higher DoP"):
        manager.register(GpuService("huge", 1, 90))
    manager.register(GpuService("ok", 2, 90))
    with pytest.raises(ValueError, match="registered already"):
        manager.register(GpuService("ok", 2, 90))
    with pytest.raises(ValueError, match="power of two"):
        GpuChunkManager(6)


def test_a_replayed_trace_restores_only_when_services_do_not_all_fit():
    services = [GpuService("judge-a", 1, 40), GpuService("judge-b", 1, 40)]
    trace = [Call(4.0 * i, ("judge-a", "judge-b")[i % 2], 1.0) for i in range(10)]
    fits = simulate(node(1, 80.0, *services), trace)
    assert [r.restore_s for r in fits] == [2.0, 2.0] + [0.0] * 8  # 40 GB at 20 GB/s, once each
    assert [r.completion_s for r in fits] == [3.0, 3.0] + [1.0] * 8
    thrash = node(1, 60.0, *services)
    results = simulate(thrash, trace)
    assert all(r.restore_s == 2.0 for r in results) and thrash.evictions == 9
    assert [r.completion_s for r in results] == [3.0] * 10


def test_a_replayed_trace_runs_one_action_per_gpu_first_come_first_served():
    manager = node(2, 80.0, GpuService("wide", 2, 20), GpuService("narrow", 1, 20))
    trace = [Call(0.0, "narrow", 5.0), Call(1.0, "wide", 1.0), Call(2.0, "narrow", 1.0)]
    results = simulate(manager, trace)
    # wide needs both GPUs: it waits for the first call; the third waits behind it though a GPU is free
    assert [(r.start_s, r.finish_s) for r in results] == [(0.0, 6.0), (6.0, 7.5), (7.5, 8.5)]
    assert [r.placement.restored for r in results] == [True, True, False]  # narrow's copy on GPU 0 stayed cached
    assert manager.evictions == 0 and manager.used_gb(0) == pytest.approx(30.0)


def test_random_traces_never_overfill_a_gpu_nor_share_one_between_actions():
    rng = random.Random(3)
    services = [GpuService(f"s{i}", rng.choice((1, 2, 4)), rng.uniform(10, 150)) for i in range(12)]
    manager = node(8, 80.0)
    for service in services:
        if service.per_gpu_gb <= 80.0:
            manager.register(service)
    names = sorted(manager.services)
    trace = sorted(
        (Call(rng.uniform(0, 100), rng.choice(names), rng.uniform(0.1, 3)) for _ in range(400)),
        key=lambda c: c.arrival_s,
    )
    results = simulate(manager, trace)
    events = sorted([(r.start_s, 1, r) for r in results] + [(r.finish_s, 0, r) for r in results], key=lambda e: e[:2])
    busy: set[int] = set()
    for _, starting, result in events:
        gpus = set(result.placement.chunk.gpus)
        if starting:
            assert not busy & gpus, "two actions on one GPU"
            busy |= gpus
        else:
            busy -= gpus
    assert all(manager.used_gb(gpu) <= 80.0 + 1e-9 for gpu in range(8))
    assert manager.hits + manager.restores == 400 and manager.free_chunks == [Chunk(0, 8)]
    assert all(r.start_s >= r.call.arrival_s for r in results)

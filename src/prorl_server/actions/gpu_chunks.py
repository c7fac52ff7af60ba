"""ARL-Tangram's GPU manager (§5.3), simulated: chunk allocation of a node's GPUs and evict-on-execution of model
services in GPU memory. A pure model (no GPU, no CUDA): it decides where actions run, what is evicted and how
long restores take, so the design can be checked before it runs on GPUs. Nothing here has run on a GPU.

- Chunks: a legal allocation is a contiguous, aligned interval of a node's GPUs, `(start, start + 2**a)` with
  `start % 2**a == 0` (a multi-level cell structure, a buddy allocator). An action needing m GPUs gets a chunk of
  m (m a power of two: the service's DoP); the smallest free chunk level that holds it is split as needed, and
  freed chunks merge with their free buddies. Among free chunks of one level, one that already caches the
  service is preferred (the paper's rule), then one where the service fits without evictions (ours: the paper
  leaves it open, and without it every new service lands on GPU 0 and evicts the last). At most one action
  runs on a GPU at a time.
- Memory: each resident copy of a service holds `weights_gb / gpus` on each GPU of its chunk. When an action's
  chunk does not hold its service, copies cached on the chunk's GPUs are evicted, least recently used first,
  until the service fits on each GPU, and the service is restored from its host copy. The host copy never
  changes, so eviction writes nothing back: it frees GPU memory only. (A copy on the chunk's GPUs is never
  executing: the chunk is free, and an executing copy holds every GPU it lives on.)
- Restore time: the per-GPU share over `pcie_gb_per_s`, every GPU copying over its own link in parallel (an
  assumption: a node whose GPUs share PCIe switches copies slower). Kernel compilation and communicator set-up,
  which the paper names as setup costs, are not modelled.

`simulate` replays a trace of calls on one node, first come, first served, and reports each call's start,
restore and finish.
"""

from __future__ import annotations

import collections
import heapq
import itertools
from dataclasses import dataclass

_GB_EPS = 1e-9  # float sums of shares
DEFAULT_PCIE_GB_PER_S = 25.0
"""Host-to-GPU copy rate per GPU: about PCIe 4.0 x16 in practice (32 GB/s in theory)."""


@dataclass(frozen=True)
class GpuService:
    """A model service on GPUs: its name, its DoP (`gpus`, a power of two; another DoP is another service) and
    the size of its weights in GB, split evenly over its GPUs."""

    name: str
    gpus: int
    weights_gb: float

    @property
    def per_gpu_gb(self) -> float:
        """What one resident copy holds on each of its GPUs."""
        return self.weights_gb / self.gpus


@dataclass(frozen=True)
class Chunk:
    """GPUs `start` to `start + size - 1` of the node."""

    start: int
    size: int

    @property
    def gpus(self) -> range:
        """The GPU indices."""
        return range(self.start, self.start + self.size)


@dataclass(frozen=True)
class Placement:
    """Where an action runs: its chunk, whether its service had to be restored, how long that took, and the
    services whose copies were evicted for it."""

    service: str
    chunk: Chunk
    restored: bool
    restore_s: float
    evicted: tuple[str, ...]


class GpuChunkManager:
    """One node's GPUs: chunk allocation and the services cached in GPU memory (see the module)."""

    def __init__(
        self, gpus: int = 8, gpu_memory_gb: float = 80.0, *, pcie_gb_per_s: float = DEFAULT_PCIE_GB_PER_S
    ) -> None:
        if not _power_of_two(gpus):
            raise ValueError(f"a node's GPU count must be a power of two (chunks are aligned halves), got {gpus}")
        if gpu_memory_gb <= 0 or pcie_gb_per_s <= 0:
            raise ValueError("gpu_memory_gb and pcie_gb_per_s must be > 0")
        self.gpus = gpus
        self.gpu_memory_gb = gpu_memory_gb
        self.pcie_gb_per_s = pcie_gb_per_s
        self.services: dict[str, GpuService] = {}
        self._free: set[Chunk] = {Chunk(0, gpus)}
        self._copies: collections.OrderedDict[tuple[str, Chunk], None] = collections.OrderedDict()  # LRU first
        self._used_gb = [0.0] * gpus
        self.hits = self.restores = self.evictions = 0
        self.restore_s_total = 0.0

    def register(self, service: GpuService) -> None:
        """Add a service (its host copy); ValueError if its name is taken, its DoP is not a chunk size of this
        node or its share does not fit one GPU's memory."""
        if service.name in self.services:
            raise ValueError(f"service {service.name!r} is registered already")
        if not _power_of_two(service.gpus) or service.gpus > self.gpus:
            raise ValueError(
                f"service {service.name!r}: DoP {service.gpus} is not a chunk size of a {self.gpus}-GPU node "
                "(1, 2, 4, ... up to the node)"
            )
        if service.per_gpu_gb > self.gpu_memory_gb:
            raise ValueError(
                f"service {service.name!r} needs {service.per_gpu_gb:g} GB per GPU and a GPU has "
                f"{self.gpu_memory_gb:g} GB: give it a higher DoP"
            )
        self.services[service.name] = service

    @property
    def free_chunks(self) -> list[Chunk]:
        """The free chunks, by start."""
        return sorted(self._free, key=lambda chunk: chunk.start)

    @property
    def resident(self) -> list[tuple[str, Chunk]]:
        """The cached copies, least recently used first."""
        return list(self._copies)

    def used_gb(self, gpu: int) -> float:
        """GPU memory held by cached copies on `gpu`."""
        return self._used_gb[gpu]

    def acquire(self, name: str) -> Placement | None:
        """Allocate a chunk for one action of service `name` and make the service resident on it; None when no
        chunk of its size is free (the action waits). KeyError for an unknown service."""
        service = self.services[name]
        chunk = self._allocate(service)
        if chunk is None:
            return None
        key = (name, chunk)
        if key in self._copies:
            self.hits += 1
            self._copies.move_to_end(key)
            return Placement(name, chunk, False, 0.0, ())
        evicted = self._make_room(service, chunk)
        for gpu in chunk.gpus:
            self._used_gb[gpu] += service.per_gpu_gb
        self._copies[key] = None
        restore_s = service.per_gpu_gb / self.pcie_gb_per_s
        self.restores += 1
        self.restore_s_total += restore_s
        return Placement(name, chunk, True, restore_s, evicted)

    def release(self, placement: Placement) -> None:
        """The action is done: its chunk is free again (merged with free buddies); the service stays cached."""
        self._copies.move_to_end((placement.service, placement.chunk))
        chunk = placement.chunk
        while chunk.size < self.gpus:
            buddy = Chunk(chunk.start ^ chunk.size, chunk.size)
            if buddy not in self._free:
                break
            self._free.remove(buddy)
            chunk = Chunk(min(chunk.start, buddy.start), chunk.size * 2)
        self._free.add(chunk)

    def _allocate(self, service: GpuService) -> Chunk | None:
        """The smallest free chunk level that holds the service; in it, a chunk caching the service first, then
        one where it fits without evictions; split down to the service's size toward that place."""
        candidates = [chunk for chunk in self._free if chunk.size >= service.gpus]
        if not candidates:
            return None
        level = min(chunk.size for chunk in candidates)
        targets = {chunk: self._target(service, chunk) for chunk in candidates if chunk.size == level}
        chunk = min(
            targets,
            key=lambda c: (
                (service.name, targets[c]) not in self._copies,
                not self._fits(service, targets[c]),
                c.start,
            ),
        )
        target = targets[chunk]
        self._free.remove(chunk)
        while chunk.size > service.gpus:
            half = chunk.size // 2
            low, high = Chunk(chunk.start, half), Chunk(chunk.start + half, half)
            chunk, spare = (low, high) if _within(target, low) else (high, low)
            self._free.add(spare)
        return chunk

    def _target(self, service: GpuService, chunk: Chunk) -> Chunk:
        """Where in free `chunk` the service would run: on a copy cached there, else where it fits without
        evictions, else at the chunk's start. (The paper prefers cached chunks; the second rule is ours.)"""
        places = [Chunk(start, service.gpus) for start in range(chunk.start, chunk.start + chunk.size, service.gpus)]
        for place in places:
            if (service.name, place) in self._copies:
                return place
        return next((place for place in places if self._fits(service, place)), places[0])

    def _fits(self, service: GpuService, place: Chunk) -> bool:
        return not self._full_gpus(service, place)

    def _full_gpus(self, service: GpuService, place: Chunk) -> list[int]:
        """The GPUs of `place` without room for one more copy of the service."""
        return [gpu for gpu in place.gpus if self._used_gb[gpu] + service.per_gpu_gb > self.gpu_memory_gb + _GB_EPS]

    def _make_room(self, service: GpuService, chunk: Chunk) -> tuple[str, ...]:
        """Evict copies on the chunk's GPUs, least recently used first, until the service fits on each."""
        evicted = []
        for name, place in list(self._copies):
            full = self._full_gpus(service, chunk)
            if not full:
                break
            if not any(gpu in place.gpus for gpu in full):
                continue
            del self._copies[(name, place)]
            for gpu in place.gpus:
                self._used_gb[gpu] -= self.services[name].per_gpu_gb
            self.evictions += 1
            evicted.append(name)
        return tuple(evicted)


@dataclass(frozen=True)
class Call:
    """One action of the trace: it arrives at `arrival_s` and computes for `compute_s` once its service is
    resident."""

    arrival_s: float
    service: str
    compute_s: float


@dataclass(frozen=True)
class CallResult:
    """When a call started (got its chunk), how long its restore took, when it finished, and where it ran."""

    call: Call
    start_s: float
    restore_s: float
    finish_s: float
    placement: Placement

    @property
    def completion_s(self) -> float:
        """The action completion time (ACT): from arrival to finish."""
        return self.finish_s - self.call.arrival_s


def simulate(manager: GpuChunkManager, calls: list[Call]) -> list[CallResult]:
    """Replay `calls` on `manager`'s node, first come, first served (a call that finds no free chunk holds up the
    ones behind it), each call running for its restore plus its compute; the results in the calls' order."""
    arrivals = sorted(range(len(calls)), key=lambda i: (calls[i].arrival_s, i))
    waiting: collections.deque[int] = collections.deque()
    running: list[tuple[float, int, int, Placement]] = []  # (finish, tie-break, call index, placement)
    order = itertools.count()
    results: dict[int, CallResult] = {}
    now = 0.0
    next_arrival = 0
    while next_arrival < len(arrivals) or waiting or running:
        times = [running[0][0]] if running else []  # the next finish, the next arrival: what can change
        if next_arrival < len(arrivals):
            times.append(calls[arrivals[next_arrival]].arrival_s)
        now = max(now, min(times))
        while running and running[0][0] <= now:
            _, _, _, placement = heapq.heappop(running)
            manager.release(placement)
        while next_arrival < len(arrivals) and calls[arrivals[next_arrival]].arrival_s <= now:
            waiting.append(arrivals[next_arrival])
            next_arrival += 1
        while waiting:
            index = waiting[0]
            placement = manager.acquire(calls[index].service)
            if placement is None:
                if not running:
                    raise ValueError(f"call {index} ({calls[index].service!r}) can never get a chunk")
                break
            waiting.popleft()
            finish = now + placement.restore_s + calls[index].compute_s
            results[index] = CallResult(calls[index], now, placement.restore_s, finish, placement)
            heapq.heappush(running, (finish, next(order), index, placement))
    return [results[i] for i in range(len(calls))]


def _power_of_two(n: int) -> bool:
    return n >= 1 and n & (n - 1) == 0


def _within(inner: Chunk, outer: Chunk) -> bool:
    return outer.start <= inner.start and inner.start + inner.size <= outer.start + outer.size

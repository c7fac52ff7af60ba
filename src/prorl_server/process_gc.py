"""The garbage collector's settings for a serving process.

A server keeps many objects alive (its modules, its app, stored results, live trajectories), and every
request allocates a few hundred short-lived ones. With CPython's defaults (a young-generation collection
every 700 net allocations) the collector runs every few jobs and promotes short-lived objects into the
older generations, whose collections walk the whole heap: on no-op jobs that was 15-25% of the server's CPU
per job (`benchmarks/bench_overhead.py`). Reference counting frees almost everything a request makes, so
the cyclic collector can run far less often; what is alive once the server has started is frozen out of
its walks for good (`gc.freeze`, as CPython's documentation suggests for long-running servers).
"""

from __future__ import annotations

import gc

SERVING_GC_THRESHOLD = (50_000, 20, 10)
"""Net allocations before a young collection, young collections before a middle one, middle before a full
one (CPython's defaults are 700, 10, 10)."""


def tune_gc_for_serving() -> None:
    """Collect once, freeze what survives (the start-up heap), and collect less often from then on.
    Process-wide: call it once, from the process that serves (`prorl-server serve`), after start-up."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*SERVING_GC_THRESHOLD)

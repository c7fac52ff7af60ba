"""BuildQueue: at most `limit` builds at once, one build per key shared by its concurrent requests, a failure
reported to every waiter, awaited from async code without blocking the event loop.

The builds here are test doubles (functions that wait on events), since the tests must control their timing.
"""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from prorl_server.imaging import BuildQueue

WAIT_S = 10.0


class BuildDouble:
    """A build that records how many run at once and returns `key` once `release` is set."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.lock = threading.Lock()
        self.running = 0
        self.most = 0
        self.calls: list[str] = []

    def __call__(self, key: str) -> str:
        with self.lock:
            self.calls.append(key)
            self.running += 1
            self.most = max(self.most, self.running)
        try:
            assert self.release.wait(WAIT_S)
            return key
        finally:
            with self.lock:
                self.running -= 1


def wait_for(condition, timeout: float = WAIT_S) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_no_more_builds_run_at_once_than_the_limit():
    queue: BuildQueue[str] = BuildQueue(3)
    double = BuildDouble()
    futures = [queue.submit(f"image-{i}", lambda i=i: double(f"image-{i}")) for i in range(20)]
    wait_for(lambda: double.running == 3)
    time.sleep(0.1)  # the others stay queued
    assert double.running == 3 and len(double.calls) == 3 and queue.pending() == 20
    double.release.set()
    assert [future.result(WAIT_S) for future in futures] == [f"image-{i}" for i in range(20)]
    assert double.most == 3 and len(double.calls) == 20 and queue.pending() == 0


def test_concurrent_requests_for_one_key_share_one_build():
    queue: BuildQueue[str] = BuildQueue(2)
    double = BuildDouble()
    first = queue.submit("same", lambda: double("same"))
    second = queue.submit("same", lambda: double("same"))
    assert second is first
    double.release.set()
    assert first.result(WAIT_S) == "same" and double.calls == ["same"]
    wait_for(lambda: queue.pending() == 0)
    assert queue.submit("same", lambda: double("same")).result(WAIT_S) == "same"  # done: a new request builds
    assert double.calls == ["same", "same"]


async def test_a_failed_build_reaches_every_waiter_and_the_next_request_builds_again():
    queue: BuildQueue[str] = BuildQueue(2)
    started, release = threading.Event(), threading.Event()
    calls = []

    def failing() -> str:
        calls.append("failing")
        started.set()
        assert release.wait(WAIT_S)
        raise RuntimeError("the build broke")

    waiters = [asyncio.create_task(queue.build("key", failing)) for _ in range(3)]
    await asyncio.to_thread(started.wait, WAIT_S)
    release.set()
    results = await asyncio.gather(*waiters, return_exceptions=True)
    assert [str(result) for result in results] == ["the build broke"] * 3 and calls == ["failing"]
    assert queue.pending() == 0
    assert await queue.build("key", lambda: "rebuilt") == "rebuilt"


async def test_awaiting_a_build_leaves_the_loop_free_and_a_cancelled_waiter_does_not_cancel_it():
    queue: BuildQueue[str] = BuildQueue(1)
    double = BuildDouble()
    cancelled = asyncio.create_task(queue.build("key", lambda: double("key")))
    waiting = asyncio.create_task(queue.build("key", lambda: double("key")))
    ticks = 0
    while ticks < 5:  # the loop runs on while the build blocks its thread
        await asyncio.sleep(0.01)
        ticks += 1
    cancelled.cancel()
    with pytest.raises(asyncio.CancelledError):
        await cancelled
    double.release.set()
    assert await waiting == "key" and double.calls == ["key"]


def test_the_limit_is_at_least_one():
    with pytest.raises(ValueError, match="at least 1"):
        BuildQueue(0)

"""A counting semaphore whose waiters may sit on different event loops (the stage threads)."""

from __future__ import annotations

import asyncio
import collections
import threading

from prorl_server.threadsafe import try_call_in_loop


class CrossLoopSemaphore:
    """`await acquire()` on any loop; `release()` from any thread hands the permit to the oldest waiter."""

    def __init__(self, value: int) -> None:
        if value < 1:
            raise ValueError("a semaphore needs at least one permit")
        self._value = value
        self._lock = threading.Lock()
        self._waiters: collections.deque[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = collections.deque()
        self._granting: dict[asyncio.Future[None], asyncio.AbstractEventLoop] = {}  # handed over, not yet taken

    @property
    def available(self) -> int:
        """Permits free right now."""
        with self._lock:
            return self._value

    async def acquire(self) -> None:
        """Wait for a permit (first come, first served)."""
        loop = asyncio.get_running_loop()
        with self._lock:
            if self._value > 0 and not self._waiters:
                self._value -= 1
                return
            future: asyncio.Future[None] = loop.create_future()
            self._waiters.append((loop, future))
        try:
            await future
        except asyncio.CancelledError:
            with self._lock:
                if (loop, future) in self._waiters:  # not granted yet: just leave the line
                    self._waiters.remove((loop, future))
            if future.done() and not future.cancelled():  # granted, then cancelled before it resumed: pass it on
                self.release()
            raise  # a grant still on its way is passed on by _grant

    def release(self) -> None:
        """Return a permit, from any thread."""
        with self._lock:
            while self._waiters:
                loop, future = self._waiters.popleft()
                if not try_call_in_loop(loop, self._grant, future):  # that waiter's loop is closed
                    continue
                self._granting[future] = loop
                return
            self._value += 1

    def _grant(self, future: asyncio.Future[None]) -> None:
        with self._lock:
            if self._granting.pop(future, None) is None:  # taken back by abandon_loop
                return
        if future.cancelled():
            self.release()
        else:
            future.set_result(None)

    def abandon_loop(self, loop: asyncio.AbstractEventLoop) -> None:
        """`loop` died: forget its waiters, and take back the permits handed to them that it never delivered."""
        with self._lock:
            self._waiters = collections.deque((lp, f) for lp, f in self._waiters if lp is not loop)
            lost = [future for future, lp in self._granting.items() if lp is loop]
            for future in lost:
                del self._granting[future]
        for _ in lost:
            self.release()

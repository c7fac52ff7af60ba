"""PauseLease: a weight-update pause ends by itself when its trainer stops looking after it.

A trainer pauses LLM dispatching, updates the engines and resumes. If it dies in between (or a reload
fails and it never resumes), the server would hold every LLM call forever. Each pause is therefore a lease:
`POST /weights/pause` arms it (for the request's `lease_s`, else the server's `--weight-pause-lease`), an
update renews it, a resume ends it. When it runs out while the server is still paused, the engines a keep
pause froze are resumed (`thaw`), dispatching resumes and a warning is logged; an engine reload in progress is waited for first (`updating`, the lock every
reload holds), so no call is dispatched to an engine half way through loading weights.

Lives on the API's event loop: every method is called from a route or the server's shutdown.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

from prorl_server.llm.weight_pause_gate import WeightPauseGate

log = logging.getLogger(__name__)


class PauseLease:
    """The deadline of the current pause, and the lock reloads hold."""

    def __init__(
        self, gate: WeightPauseGate, default_s: float, thaw: Callable[[], Awaitable[list[str]]] | None = None
    ) -> None:
        self.gate = gate
        self.default_s = default_s
        self.thaw = thaw  # resumes the engines a keep pause froze; returns the failures
        self.updating = asyncio.Lock()  # held while engines reload; the lease waits for it before resuming
        self.expired = 0  # pauses ended by the lease
        self._lease_s = default_s
        self._deadline: float | None = None
        self._task: asyncio.Task[None] | None = None

    @property
    def left_s(self) -> float | None:
        """Seconds until the pause ends by itself; None while no lease runs."""
        if self._deadline is None:
            return None
        return max(0.0, self._deadline - time.monotonic())

    def arm(self, lease_s: float | None = None) -> None:
        """Start (or restart) the lease: `lease_s`, else the server's default. Called on a pause."""
        self._lease_s = lease_s or self.default_s
        self.renew()

    def renew(self) -> None:
        """Restart the lease with the length the pause asked for. Called on an update."""
        self.end()
        self._deadline = time.monotonic() + self._lease_s
        self._task = asyncio.get_running_loop().create_task(self._expire(self._lease_s))

    def end(self) -> None:
        """No lease runs any more (the pause was resumed, or the server is closing)."""
        if self._task is not None:
            self._task.cancel()
        self._task = self._deadline = None

    async def _expire(self, lease_s: float) -> None:
        await asyncio.sleep(lease_s)
        async with self.updating:
            if self.gate.paused and self.thaw is not None:
                for failure in await self.thaw():
                    log.warning("resuming a frozen LLM engine after the pause's lease failed: %s", failure)
            if self.gate.resume():
                self.expired += 1
                log.warning(
                    "weight-update pause ended by its lease: no pause, update or resume came for %g s (a trainer "
                    "that stopped mid-update?); LLM dispatching goes on under the current weight version",
                    lease_s,
                )
        self._task = self._deadline = None

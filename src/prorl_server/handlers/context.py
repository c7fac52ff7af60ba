"""JobContext: everything a handler sees of one job."""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, TypeVar

from prorl_server.llm import LLMSession
from prorl_server.protocol import Trajectory
from prorl_server.sandbox.base import Sandbox
from prorl_server.sandbox.manager import SandboxManager
from prorl_server.sandbox.spec import SandboxSpec

log = logging.getLogger(__name__)
T = TypeVar("T")

ReleaseCallback = Callable[[], Awaitable[None] | None]


@dataclass
class JobContext:
    """One job as a handler sees it.

    - `instance`: the task instance as posted (with `data_source`).
    - `sampling_params`: what goes to vLLM (already in `llm`'s defaults).
    - `agent_config`: agent settings such as `max_turns`.
    - `llm`: the job's token-in/token-out session; it fills `trajectory`.
    - `artifacts`: anything RUN produces for EVAL and for the trainer (a diff, an answer); returned.
    - `state`: private scratch space shared by the job's stages; not returned.
    """

    job_id: str
    instance: dict[str, Any]
    sampling_params: dict[str, Any]
    agent_config: dict[str, Any]
    llm: LLMSession
    trajectory: Trajectory
    artifacts: dict[str, Any] = field(default_factory=dict)
    state: dict[str, Any] = field(default_factory=dict)
    stage: str = "queued"
    sandbox: Sandbox | None = None
    _sandboxes: SandboxManager | None = field(default=None, repr=False)
    _release_callbacks: list[ReleaseCallback] = field(default_factory=list, repr=False)
    _loop: asyncio.AbstractEventLoop | None = field(default=None, repr=False)

    @property
    def data_source(self) -> str:
        """The instance's `data_source` (the handler's name)."""
        return str(self.instance["data_source"])

    async def start_sandbox(self, spec: SandboxSpec | None = None) -> Sandbox:
        """Start a sandbox for this job (the server's default spec unless given).

        It is closed on release: right after RUN for one started in INIT or RUN, when the job ends for
        one started in EVAL (so EVAL can test in a fresh sandbox the agent never touched). The first
        sandbox started becomes `ctx.sandbox` until it is closed.
        """
        if self._sandboxes is None:
            raise RuntimeError("this server runs without a sandbox runtime (see --runtime)")
        manager = self._sandboxes
        sandbox = await manager.start(spec)
        self.on_release(lambda: manager.close(sandbox))
        if self.sandbox is None:
            self.sandbox = sandbox
        return sandbox

    def on_release(self, callback: ReleaseCallback) -> None:
        """Register a resource cleanup (sync or async), run right after RUN, or on failure/cancel.

        Callbacks run once, most recent first, on whatever stage thread releases the job.
        """
        self._release_callbacks.append(callback)

    async def release(self) -> None:
        """Run and forget the registered cleanups (idempotent); errors are logged, never raised."""
        while self._release_callbacks:
            callback = self._release_callbacks.pop()
            try:
                outcome = callback()
                if inspect.isawaitable(outcome):
                    await outcome
            except Exception:
                log.exception("release callback of job %s failed", self.job_id)
        self.sandbox = None
        self.llm.close()

    def wait(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        """From a synchronous handler method (it runs in a worker thread), run an async call such as
        `ctx.llm.generate()` on the stage's event loop and return its result."""
        if self._loop is None:
            raise RuntimeError("JobContext.wait() is only available while a stage runs")
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is self._loop:
            coro.close()
            raise RuntimeError("JobContext.wait() is for synchronous methods; in async methods use await")
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

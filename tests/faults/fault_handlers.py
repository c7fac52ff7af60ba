"""Handlers that misbehave on request, as a hostile or careless plugin author's would.

The instance says where and how: `{"data_source": "fault_async" | "fault_sync", "method": M, "fault": F}`.
`M` is a handler method (`init`, `run`, `eval`, `final_result`, an exception hook such as `run_exception`,
`release` for a cleanup registered with `ctx.on_release`, or `validate_instance`); `F` names an exception
from `FAULTS` or a misbehaviour from `BEHAVIOURS`. `fault_async` defines every method as `async def` (run on
the stage's event loop); `fault_sync` as a plain `def` (run in the stage's worker threads). `"via_thread":
true` raises from `asyncio.to_thread` inside an async method. A hook is reached by first raising a
RuntimeError in its stage.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import threading
from collections.abc import Callable
from typing import Any

from prorl_server import AgentHandler, ErrorInfo, JobContext, JobResult
from prorl_server.handlers import default_error


class UnprintableError(Exception):
    """An exception whose `__str__` raises."""

    def __str__(self) -> str:
        raise RuntimeError("__str__ exploded")


class UnrepresentableError(Exception):
    """An exception whose `__str__` and `__repr__` both raise."""

    def __str__(self) -> str:
        raise ValueError("__str__ exploded")

    def __repr__(self) -> str:
        raise ValueError("__repr__ exploded")


class PluginAbort(BaseException):
    """A BaseException of the plugin's own (not an Exception)."""


def _raise(exc: BaseException) -> Callable[[], None]:
    def fault() -> None:
        raise exc

    return fault


FAULTS: dict[str, Callable[[], BaseException]] = {
    "cancelled": lambda: asyncio.CancelledError("the library cancelled itself"),
    "generator_exit": lambda: GeneratorExit("closed"),
    "system_exit": lambda: SystemExit(2),
    "keyboard_interrupt": lambda: KeyboardInterrupt(),
    "plugin_base_exception": lambda: PluginAbort("plugin gave up"),
    "stop_iteration": lambda: StopIteration("done"),
    "unprintable": lambda: UnprintableError(),
    "unrepresentable": lambda: UnrepresentableError(),
    "exception_group": lambda: BaseExceptionGroup("several", [SystemExit(1), ValueError("v")]),
    "runtime_error": lambda: RuntimeError("an ordinary bug"),
}
"""Exceptions a handler method raises (a fresh one per call)."""

STAGE_METHODS = ("init", "run", "eval")
HOOKS = ("init_exception", "run_exception", "eval_exception")
METHODS = (*STAGE_METHODS, *HOOKS, "final_result", "release")
"""Every method a fault can be raised from during a job."""


def _hook_stage(method: str) -> str | None:
    return method.removesuffix("_exception") if method in HOOKS else None


class _Faults:
    """What both handlers share: deciding whether this call misbehaves, and how."""

    def __init__(self) -> None:
        self.released: list[str] = []
        self.blocked = threading.Event()  # set at teardown: releases threads blocked on purpose

    def _fault_here(self, ctx: JobContext, method: str) -> str | None:
        target = ctx.instance.get("method")
        if target == method:
            return ctx.instance.get("fault")
        if method in STAGE_METHODS and _hook_stage(str(target)) == method:
            return "runtime_error"  # reach the hook of this stage
        return None

    def _release_callback(self, ctx: JobContext) -> Callable[[], None]:
        fault = self._fault_here(ctx, "release")

        def release() -> None:
            self.released.append(ctx.job_id)
            if fault is not None:
                raise FAULTS[fault]()

        return release


class AsyncFaultHandler(_Faults, AgentHandler):
    """Every method is `async def`."""

    name = "fault_async"

    async def _maybe(self, ctx: JobContext, method: str) -> None:
        fault = self._fault_here(ctx, method)
        if fault is None:
            return
        if fault == "ignore_cancel":
            while True:  # swallows every cancellation
                with contextlib.suppress(asyncio.CancelledError):
                    await asyncio.sleep(3600)
        exc = FAULTS[fault]()
        if ctx.instance.get("via_thread"):
            await asyncio.to_thread(_raise(exc))
        raise exc

    async def init(self, ctx: JobContext) -> None:
        ctx.on_release(self._release_callback(ctx))
        await self._maybe(ctx, "init")

    async def run(self, ctx: JobContext) -> None:
        await self._maybe(ctx, "run")

    async def eval(self, ctx: JobContext) -> float:
        await self._maybe(ctx, "eval")
        return 1.0

    async def init_exception(self, ctx: JobContext, exc: BaseException) -> ErrorInfo | None:
        await self._maybe(ctx, "init_exception")
        return default_error("init", exc)

    async def run_exception(self, ctx: JobContext, exc: BaseException) -> ErrorInfo | None:
        await self._maybe(ctx, "run_exception")
        return default_error("run", exc)

    async def eval_exception(self, ctx: JobContext, exc: BaseException) -> ErrorInfo | None:
        await self._maybe(ctx, "eval_exception")
        return default_error("eval", exc)

    async def final_result(self, ctx: JobContext, result: JobResult) -> JobResult:
        await self._maybe(ctx, "final_result")
        return result


class SyncFaultHandler(_Faults, AgentHandler):
    """Every method is a plain `def` (it runs in a worker thread of its stage)."""

    name = "fault_sync"

    def _maybe(self, ctx: JobContext, method: str) -> None:
        fault = self._fault_here(ctx, method)
        if fault is None:
            return
        if fault == "block":
            self.blocked.wait()  # a thread that never returns (until teardown)
            return
        raise FAULTS[fault]()

    def validate_instance(self, instance: dict[str, Any]) -> None:
        if instance.get("method") == "validate_instance":
            raise FAULTS[instance["fault"]]()

    def init(self, ctx: JobContext) -> None:
        ctx.on_release(self._release_callback(ctx))
        self._maybe(ctx, "init")

    def run(self, ctx: JobContext) -> None:
        self._maybe(ctx, "run")

    def eval(self, ctx: JobContext) -> float:
        self._maybe(ctx, "eval")
        return 1.0

    def init_exception(self, ctx: JobContext, exc: BaseException) -> ErrorInfo | None:
        self._maybe(ctx, "init_exception")
        return default_error("init", exc)

    def run_exception(self, ctx: JobContext, exc: BaseException) -> ErrorInfo | None:
        self._maybe(ctx, "run_exception")
        return default_error("run", exc)

    def eval_exception(self, ctx: JobContext, exc: BaseException) -> ErrorInfo | None:
        self._maybe(ctx, "eval_exception")
        return default_error("eval", exc)

    def final_result(self, ctx: JobContext, result: JobResult) -> JobResult:
        self._maybe(ctx, "final_result")
        return result


class LoopKillerHandler(AgentHandler):
    """Takes its stage's event loop down from outside the stage task (what containment cannot catch):
    `how` is `stop` (loop.stop()), `callback_exit` (a callback raising SystemExit) or `task_exit` (a task of
    its own raising SystemExit)."""

    name = "loop_killer"

    async def run(self, ctx: JobContext) -> None:
        loop = asyncio.get_running_loop()
        how = ctx.instance["how"]
        if how == "stop":
            loop.stop()
        elif how == "callback_exit":
            loop.call_soon(sys.exit, 3)
        elif how == "task_exit":

            async def exit_later() -> None:
                raise SystemExit(4)

            ctx.state["exit_task"] = loop.create_task(exit_later())
        await asyncio.sleep(3600)

    async def eval(self, ctx: JobContext) -> float:
        return 1.0


class ServiceHolderHandler(AgentHandler):
    """Holds a slot of service `one` for an hour, or (`then_kill`) waits in line for one in a task of its own,
    then takes its stage's loop down as LoopKillerHandler's `task_exit` does."""

    name = "service_holder"

    async def run(self, ctx: JobContext) -> None:
        if not ctx.instance.get("then_kill"):
            async with ctx.service("one"):
                await asyncio.sleep(3600)
            return

        async def wait_in_line() -> None:
            async with ctx.service("one"):
                await asyncio.sleep(3600)

        async def exit_later() -> None:
            await asyncio.sleep(0.3)
            raise SystemExit(5)

        loop = asyncio.get_running_loop()
        ctx.state["tasks"] = [loop.create_task(wait_in_line()), loop.create_task(exit_later())]
        await asyncio.sleep(3600)

    async def eval(self, ctx: JobContext) -> float:
        return 1.0

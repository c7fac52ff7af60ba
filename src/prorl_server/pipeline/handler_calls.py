"""Handler methods, looked up once per handler; calling them (async or sync); reading what EVAL returned."""

from __future__ import annotations

import asyncio
import inspect
import math
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any

from prorl_server.errors import PipelineError
from prorl_server.handlers import AgentHandler, JobContext, cancel_requested, exception_message
from prorl_server.pipeline.handler_threads import HandlerThreads
from prorl_server.protocol import Stage


class HandlerFault(PipelineError):
    """A handler method raised what `except Exception` does not catch: SystemExit, KeyboardInterrupt,
    GeneratorExit, a CancelledError nobody asked for, a BaseException of its own. Carried as an ordinary
    exception, it fails the job (the handler's exception hooks never see it) instead of unwinding the
    stage's worker or event loop. `original` is what the handler raised."""

    def __init__(self, method: str, original: BaseException) -> None:
        super().__init__(method, original)
        self.method = method
        self.original = original

    def __str__(self) -> str:
        return f"{self.method}() raised {type(self.original).__name__}: {exception_message(self.original)}"


@dataclass(frozen=True)
class HandlerMethod:
    """One method of a handler object, looked up once.

    `overridden`: the handler's class replaces AgentHandler's default. A default runs inline (they are
    cheap and synchronous); otherwise an `async def` is awaited and a plain one runs on the executor.
    `runs_after_end`: it is called once the job has ended (`final_result`), so its `ctx.wait` calls run.
    """

    name: str
    fn: Callable[..., Any]
    is_async: bool
    overridden: bool
    runs_after_end: bool = False

    @classmethod
    def of(cls, handler: AgentHandler, name: str, *, runs_after_end: bool = False) -> HandlerMethod:
        """Look up `handler.<name>`."""
        fn = getattr(handler, name)
        overridden = getattr(type(handler), name) is not getattr(AgentHandler, name)
        return cls(name, fn, inspect.iscoroutinefunction(fn), overridden, runs_after_end)

    async def call(self, ctx: JobContext, *args: Any, threads: HandlerThreads) -> Any:
        """Call the method with `ctx` and `args` (see the class docstring for where it runs).

        An `Exception` it raises propagates as is; anything else it raises becomes a HandlerFault. A
        cancellation of the calling task (the server's) propagates as CancelledError."""
        if not self.overridden:
            return self.fn(ctx, *args)
        task = asyncio.current_task()
        try:
            if self.is_async:
                return await self.fn(ctx, *args)
            fn = partial(_after_end, self.fn) if self.runs_after_end else self.fn
            ok, outcome = await threads.run(fn, ctx, *args, owner=ctx.job_id)
            if not ok:
                if isinstance(outcome, StopIteration):  # it cannot travel through a coroutine (PEP 479)
                    raise HandlerFault(self.name, outcome)
                raise outcome
            if inspect.isawaitable(outcome):
                outcome = await outcome
            return outcome
        except Exception:
            raise
        except BaseException as exc:
            if isinstance(exc, asyncio.CancelledError) and cancel_requested():
                raise
            if isinstance(exc, GeneratorExit) and _current_task() is not task:
                raise  # this coroutine is being closed (garbage-collected after its loop died): let it
            raise HandlerFault(self.name, exc) from exc


def _after_end(fn: Callable[..., Any], ctx: JobContext, *args: Any) -> Any:
    """Call `fn(ctx, *args)` in this worker thread with `ctx.wait` allowed although the job has ended."""
    with ctx.waits_after_end():
        return fn(ctx, *args)


def _current_task() -> asyncio.Task[Any] | None:
    try:
        return asyncio.current_task()
    except RuntimeError:  # no running loop
        return None


@dataclass(frozen=True)
class HandlerMethods:
    """A handler's stage methods, exception hooks and `final_result`, resolved once (see `resolve`)."""

    handler: AgentHandler
    stages: Mapping[Stage, HandlerMethod]
    exception_hooks: Mapping[Stage, HandlerMethod]
    final_result: HandlerMethod

    @classmethod
    def resolve(cls, handler: AgentHandler) -> HandlerMethods:
        """Look up every method the pipeline calls on `handler`."""
        return cls(
            handler=handler,
            stages={stage: HandlerMethod.of(handler, stage.value) for stage in Stage},
            exception_hooks={stage: HandlerMethod.of(handler, stage.exception_hook) for stage in Stage},
            final_result=HandlerMethod.of(handler, "final_result", runs_after_end=True),
        )

    def stage(self, stage: Stage) -> HandlerMethod:
        """The handler's method for `stage` (`init`, `run` or `eval`)."""
        return self.stages[stage]

    def exception_hook(self, stage: Stage) -> HandlerMethod:
        """The handler's hook for an exception raised in `stage` (`init_exception`, ...)."""
        return self.exception_hooks[stage]


class HandlerMethodCache:
    """The HandlerMethods of each handler object, resolved the first time the object is seen."""

    def __init__(self) -> None:
        self._by_id: dict[int, HandlerMethods] = {}  # each entry keeps its handler alive: ids stay unique
        self._lock = threading.Lock()

    def get(self, handler: AgentHandler) -> HandlerMethods:
        """`handler`'s methods (resolved now if this is the first time)."""
        with self._lock:
            methods = self._by_id.get(id(handler))
            if methods is None or methods.handler is not handler:
                methods = self._by_id[id(handler)] = HandlerMethods.resolve(handler)
            return methods


def parse_eval_outcome(value: Any) -> tuple[float, dict[str, Any]]:
    """EVAL's return value -> (reward, details). Accepts a number or a dict with a `reward` key."""
    if isinstance(value, dict):
        details = dict(value)
        if "reward" not in details:
            raise ValueError(f"eval() returned a dict without a 'reward' key (keys: {sorted(details)})")
        reward = details.pop("reward")
    else:
        reward, details = value, {}
    if isinstance(reward, bool):
        reward = float(reward)
    if not isinstance(reward, int | float):
        raise TypeError(f"eval() must return a float reward or a dict with 'reward', got {type(reward).__name__}")
    try:
        reward = float(reward)
    except OverflowError:  # an int beyond a float's range (its digits alone may be too many to print)
        raise ValueError(
            f"eval() returned a reward too large for a float (an int of {reward.bit_length()} bits)"
        ) from None
    if not math.isfinite(reward):
        raise ValueError(f"eval() returned a non-finite reward ({reward})")
    return reward, details

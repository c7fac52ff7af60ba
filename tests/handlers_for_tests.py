"""Handlers used by the tests (each pins down one behaviour of the pipeline)."""

from __future__ import annotations

import asyncio
import random
import threading
import time

from prorl_server import AgentHandler, JobContext


class MultiTurnChatHandler(AgentHandler):
    """Asks the question, then answers every model turn with an observation until the model says DONE."""

    name = "multiturn"

    async def run(self, ctx: JobContext) -> None:
        await ctx.llm.start([{"role": "user", "content": ctx.instance["question"]}])
        for turn in range(int(ctx.agent_config.get("max_turns", 3))):
            reply = await ctx.llm.generate()
            if "DONE" in reply.text:
                ctx.artifacts["answer"] = reply.text
                return
            await ctx.llm.add_messages([{"role": "user", "content": f"observation {turn}"}])

    async def eval(self, ctx: JobContext) -> dict:
        return {"reward": 1.0 if "answer" in ctx.artifacts else 0.0, "turns": len(ctx.trajectory.turns)}


class NoOpHandler(AgentHandler):
    """Does nothing in every stage; reward 1."""

    name = "noop"

    async def run(self, ctx: JobContext) -> None:
        return None

    async def eval(self, ctx: JobContext) -> float:
        return 1.0


class SyncHandler(AgentHandler):
    """Plain `def` methods, one of which blocks its thread; records the threads it ran on."""

    name = "sync"

    def __init__(self) -> None:
        self.threads: set[str] = set()

    def init(self, ctx: JobContext) -> None:
        self.threads.add(threading.current_thread().name)
        time.sleep(float(ctx.instance.get("block_s", 0.0)))

    def run(self, ctx: JobContext) -> None:
        self.threads.add(threading.current_thread().name)
        ctx.wait(ctx.llm.start([{"role": "user", "content": "hi"}]))
        ctx.artifacts["text"] = ctx.wait(ctx.llm.generate()).text

    def eval(self, ctx: JobContext) -> float:
        self.threads.add(threading.current_thread().name)
        return 0.5


class RaisingHandler(AgentHandler):
    """Raises in the stage named by `instance["fail_in"]`."""

    name = "raising"

    def __init__(self) -> None:
        self.released: list[str] = []

    async def init(self, ctx: JobContext) -> None:
        ctx.on_release(lambda: self.released.append(ctx.job_id))
        if ctx.instance.get("fail_in") == "init":
            raise RuntimeError("sandbox image missing")

    async def run(self, ctx: JobContext) -> None:
        await ctx.llm.start([{"role": "user", "content": "go"}])
        await ctx.llm.generate()
        if ctx.instance.get("fail_in") == "run":
            raise ValueError("tool crashed")

    async def eval(self, ctx: JobContext) -> float:
        if ctx.instance.get("fail_in") == "eval":
            raise KeyError("expected_output")
        if ctx.instance.get("fail_in") == "bad_reward":
            return "high"  # type: ignore[return-value]
        return 1.0


class SlowStageHandler(AgentHandler):
    """Sleeps in each stage as the instance says; records releases; for timeout and cancel tests. Its reward
    is 1, or a coin toss (0 or 1) with `coin_reward`."""

    name = "slow"

    def __init__(self) -> None:
        self.released: list[str] = []
        self.cancelled: list[str] = []

    async def init(self, ctx: JobContext) -> None:
        ctx.on_release(lambda: self.released.append(ctx.job_id))
        await asyncio.sleep(float(ctx.instance.get("init_s", 0.0)))

    async def run(self, ctx: JobContext) -> None:
        try:
            await ctx.llm.start([{"role": "user", "content": "work"}])
            for _ in range(int(ctx.instance.get("turns", 1))):
                await ctx.llm.generate()
                await ctx.llm.add_messages([{"role": "user", "content": "more"}])
            await asyncio.sleep(float(ctx.instance.get("run_s", 0.0)))
        except asyncio.CancelledError:
            self.cancelled.append(ctx.job_id)
            raise

    async def eval(self, ctx: JobContext) -> float:
        await asyncio.sleep(float(ctx.instance.get("eval_s", 0.0)))
        return float(random.random() < 0.5) if ctx.instance.get("coin_reward") else 1.0


class GatedHandler(AgentHandler):
    """Up to `max_turns` turns; between turns it waits for the job's event in `proceed` (when there is one),
    else sleeps `instance.tool_s` seconds (its "tool time")."""

    name = "gated"

    def __init__(self) -> None:
        self.proceed: dict[str, threading.Event] = {}

    async def run(self, ctx: JobContext) -> None:
        await ctx.llm.start([{"role": "user", "content": ctx.instance["question"]}])
        turns = int(ctx.agent_config.get("max_turns", 1))
        for turn in range(turns):
            await ctx.llm.generate()
            if turn + 1 == turns:
                return
            event = self.proceed.get(ctx.job_id)
            if event is not None:
                while not event.is_set():
                    await asyncio.sleep(0.01)
            else:
                await asyncio.sleep(float(ctx.instance.get("tool_s", 0.0)))
            await ctx.llm.add_messages([{"role": "user", "content": f"observation {turn}"}])

    async def eval(self, ctx: JobContext) -> float:
        return 1.0

"""The handler bench_agent_loop.py loads into prorl-server: the built-in AgentLoop, one tool call per turn.

The simulator writes random letters, never a tool call, so the loop runs with a tool-call format of this
benchmark's (`bench_every_turn`, registered in `tool_call_formats.FORMATS` when this module is imported):
it parses the turn as Hermes does (the same scan of the text, which finds nothing) and then reads it as one
call of the `work` tool, so that every turn takes the loop's tool path (argument check, tool run,
observation appended as a `tool` message). `work` sleeps the trajectory's tool time of the turn
(`instance["tool_s"][turn]`, wall seconds) and returns `instance["observations"][turn]` characters, marked
with the trajectory's index (`@@{index}@@`) so that the simulator can tell whose `/tokenize` a request is.

What the handler records in `artifacts["bench"]` (time.monotonic(), this process): `start` (after the
trajectory's start delay, right before `AgentLoop.run`), `tools` ([entry, exit] of each `work` call), `end`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import Any

from prorl_server import AgentHandler, JobContext
from prorl_server.agent import AgentLoop, Tool, ToolCall
from prorl_server.tool_call_formats import FORMATS, HERMES, Parsed, ToolCallFormat, ToolSchemas

FORMAT_NAME = "bench_every_turn"
INSTRUCTIONS = "You are a coding agent. Use the work tool to make progress on the task, one step per turn."


class EveryTurnOneCall(ToolCallFormat):
    """Hermes, except that a turn without a call is read as one call of `work` (the simulator's text)."""

    name = FORMAT_NAME
    hint = HERMES.hint

    def parse(self, text: str, tools: ToolSchemas | None = None) -> Parsed:
        content, calls = HERMES.parse(text, tools)
        return content, calls or [ToolCall("work", {})]

    def render(self, calls: Sequence[ToolCall]) -> str:
        return HERMES.render(calls)

    def detect(self, chat_template: str) -> bool:
        return False


FORMATS.setdefault(FORMAT_NAME, EveryTurnOneCall())


async def work(ctx: JobContext, arguments: dict[str, Any]) -> str:
    """The tool: sleep this turn's tool time, return this turn's observation."""
    bench = ctx.artifacts["bench"]
    turn = len(bench["tools"])
    entered = time.monotonic()
    await asyncio.sleep(float(ctx.instance["tool_s"][turn]))
    bench["tools"].append([entered, time.monotonic()])
    return f"@@{ctx.instance['index']}@@ " + "o" * int(ctx.instance["observations"][turn])


LOOP = AgentLoop(
    [Tool("work", "Do one step of work on the task.", run=work)],
    INSTRUCTIONS,
    on_no_tool_call="finish",
    tool_format=FORMAT_NAME,
)


class AgentLoopBenchHandler(AgentHandler):
    """`AgentLoop.run` on the instance's task, for `instance["turns"]` turns (`max_turns`)."""

    name = "agent_loop_bench"

    async def run(self, ctx: JobContext) -> None:
        plan = ctx.instance
        await asyncio.sleep(float(plan["delay_s"]))  # spreads the starts, as in the baseline
        bench: dict[str, Any] = {"tools": []}
        ctx.artifacts["bench"] = bench
        bench["start"] = time.monotonic()
        await LOOP.run(ctx, f"@@{plan['index']}@@ {plan['prompt']}")
        bench["end"] = time.monotonic()

    async def eval(self, ctx: JobContext) -> float:
        return 0.0

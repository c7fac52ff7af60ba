"""The handler bench_scheduling.py loads into prorl-server: a multi-turn agent whose plan is in the instance.

The instance carries the plan of one trajectory, drawn by the benchmark from a seeded generator:
`prompt` (the text every sample of a prompt shares), `tokens` (output tokens of each turn), `tool_s` (simulated
seconds of tool work after each turn but the last), `observations` (characters of each tool result; the
simulator's tokenizer gives one token per character) and `time_scale` (the simulator's simulated seconds per
wall second). Each turn asks for exactly its token count (`ignore_eos` with `max_tokens`), then the handler
sleeps the tool time divided by `time_scale` and appends the tool result as observation tokens, so the context
grows turn after turn (multi-turn prefix reuse).
"""

from __future__ import annotations

import asyncio

from prorl_server import AgentHandler, JobContext


class SchedulingHandler(AgentHandler):
    """Turns of exactly `tokens[i]` output tokens with `tool_s[i]` of tool work and an observation between them."""

    name = "scheduling"

    async def run(self, ctx: JobContext) -> None:
        plan = ctx.instance
        scale = float(plan["time_scale"])
        tokens = [int(t) for t in plan["tokens"]]
        await ctx.llm.start([{"role": "user", "content": str(plan["prompt"])}])
        for turn, count in enumerate(tokens):
            await ctx.llm.generate(max_tokens=count, ignore_eos=True)
            if turn + 1 < len(tokens):
                await asyncio.sleep(float(plan["tool_s"][turn]) / scale)
                observation = "o" * int(plan["observations"][turn])
                await ctx.llm.add_messages([{"role": "user", "content": observation}])

    async def eval(self, ctx: JobContext) -> float:
        return 0.0

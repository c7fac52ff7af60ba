"""The handler bench_dapo.py loads into prorl-server: a simulated agent rollout of known length and reward.

Member `i` of a group (job id `{group_id}:{i}`) asks the LLM backend for one turn, then "works" for
`instance["delays"][i]` seconds (the long-tailed part of an agent rollout: tool calls, more turns) and scores
`instance["rewards"][i]`. The benchmark draws both from a seeded generator, so every strategy it compares
sees the same prompts with the same rollout times and rewards.
"""

from __future__ import annotations

import asyncio

from prorl_server import AgentHandler, JobContext


class DapoHandler(AgentHandler):
    """One LLM turn, then `delays[i]` seconds of simulated work; reward `rewards[i]` (member index `i`)."""

    name = "dapo"

    async def run(self, ctx: JobContext) -> None:
        await ctx.llm.start([{"role": "user", "content": str(ctx.instance.get("prompt", "solve"))}])
        await ctx.llm.generate()
        delays = ctx.instance["delays"]
        await asyncio.sleep(float(delays[member(ctx) % len(delays)]))

    async def eval(self, ctx: JobContext) -> float:
        rewards = ctx.instance["rewards"]
        return float(rewards[member(ctx) % len(rewards)])


def member(ctx: JobContext) -> int:
    """The member index of a group job (`{group_id}:{i}`); 0 for a job outside a group."""
    _, _, index = ctx.job_id.rpartition(":")
    return int(index) if index.isdigit() else 0

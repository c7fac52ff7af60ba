"""The handler bench_fidelity.py loads into prorl-server: multi-turn chats without tools."""

from __future__ import annotations

from prorl_server import AgentHandler, JobContext

FOLLOW_UPS = ["Tell me more.", "Can you say it differently?", "Summarize that in a few words.", "Why?"]


class FollowUpHandler(AgentHandler):
    """A multi-turn chat without tools: the question, then a follow-up user message after every turn."""

    name = "followup"
    agent_config_keys = frozenset({"turns"})

    async def run(self, ctx: JobContext) -> None:
        system = {"role": "system", "content": "You are a helpful assistant."}
        await ctx.llm.start([system, {"role": "user", "content": ctx.instance["question"]}])
        turns = int(ctx.agent_config.get("turns", 2))
        for turn in range(turns):
            await ctx.llm.generate(seed=int(ctx.instance["seed"]) * 100 + turn)
            if turn + 1 < turns:
                await ctx.llm.add_messages([{"role": "user", "content": FOLLOW_UPS[turn % len(FOLLOW_UPS)]}])

    async def eval(self, ctx: JobContext) -> float:
        return 0.0

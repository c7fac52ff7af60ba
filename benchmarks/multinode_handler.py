"""The handler bench_multinode.py loads into prorl-server: one LLM turn of a fixed length, or a hold.

`tokens` > 0: one turn of exactly that many output tokens (`ignore_eos` with `max_tokens`), so that the
rollout lasts as long as the simulated backend takes for them. `release_at` (a `time.time()` value): the RUN
stage then waits until that moment, so that every job submitted before it is live at once and all end
together. INIT does nothing, EVAL scores 0.
"""

from __future__ import annotations

import asyncio
import time

from prorl_server import AgentHandler, JobContext


class MultinodeHandler(AgentHandler):
    """One turn of `tokens` tokens (when > 0), then a hold until `release_at` (when given)."""

    name = "multinode"

    async def init(self, ctx: JobContext) -> None:
        """Nothing to set up (async, so that no worker thread runs it)."""

    async def run(self, ctx: JobContext) -> None:
        tokens = int(ctx.instance.get("tokens", 0))
        if tokens > 0:
            await ctx.llm.start([{"role": "user", "content": str(ctx.instance.get("prompt", "solve"))}])
            await ctx.llm.generate(max_tokens=tokens, ignore_eos=True)
        release_at = ctx.instance.get("release_at")
        if release_at is not None:
            await asyncio.sleep(max(0.0, float(release_at) - time.time()))

    async def eval(self, ctx: JobContext) -> float:
        return 0.0

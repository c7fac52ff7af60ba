"""A test handler whose jobs hold a sandbox until they are cancelled, so that a test or benchmark can stop a
server while jobs and sandboxes are live and then look for leftovers (tests/test_slurm.py, bench_slurm.py):
`prorl-server serve --handler prorl_server.testing.hold_handler:SandboxHoldHandler`."""

from __future__ import annotations

import asyncio

from prorl_server.handlers import AgentHandler, JobContext


class SandboxHoldHandler(AgentHandler):
    """INIT starts a sandbox; RUN runs `sleep <hold_s>` in it (default 600 s) and, when cancelled, takes
    `unwind_s` seconds (default 0) to unwind, as a job cleaning up would; EVAL scores 0."""

    name = "sandbox_hold"

    async def init(self, ctx: JobContext) -> None:
        await ctx.start_sandbox()

    async def run(self, ctx: JobContext) -> None:
        hold_s = float(ctx.instance.get("hold_s", 600))
        try:
            await ctx.sandbox.bash(f"sleep {hold_s}", timeout=hold_s + 30, dop=0)  # waits: holds no core
        except asyncio.CancelledError:
            await asyncio.sleep(float(ctx.instance.get("unwind_s", 0)))
            raise

    async def eval(self, ctx: JobContext) -> float:
        return 0.0

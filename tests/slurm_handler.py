"""A handler for the Slurm deployment test, loaded by the rollout servers with `--handler`: each job holds a
sandbox with a command running in it until the job is cancelled, so the test can `scancel` the service while
jobs and sandboxes are live and then look for leftovers."""

from __future__ import annotations

from prorl_server.handlers import AgentHandler, JobContext


class SandboxHoldHandler(AgentHandler):
    """INIT starts a sandbox; RUN runs `sleep <hold_s>` in it (default 600 s); EVAL scores 0."""

    name = "sandbox_hold"

    async def init(self, ctx: JobContext) -> None:
        await ctx.start_sandbox()

    async def run(self, ctx: JobContext) -> None:
        hold_s = float(ctx.instance.get("hold_s", 600))
        await ctx.sandbox.bash(f"sleep {hold_s}", timeout=hold_s + 30)

    async def eval(self, ctx: JobContext) -> float:
        return 0.0

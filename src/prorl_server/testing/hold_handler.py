"""Test handlers for deployments: `SandboxHoldHandler`, whose jobs hold a sandbox until they are cancelled, so
that a test or benchmark can stop a server while jobs and sandboxes are live and then look for leftovers
(tests/launch/test_slurm*.py, bench_slurm.py), and `SandboxCommandHandler`, one LLM turn then a scored command in a
sandbox (tests/launch/test_slurm_multinode.py):
`prorl-server serve --handler prorl_server.testing.hold_handler:SandboxHoldHandler` (or `:SandboxCommandHandler`)."""

from __future__ import annotations

import asyncio
import os

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


class SandboxCommandHandler(AgentHandler):
    """INIT starts a sandbox; RUN asks the LLM one question, then runs `echo $(( A * B ))` in the sandbox
    (`a`, `b` from the instance, default 6 and 7); EVAL scores 1.0 when the sandbox printed A * B. The
    artifacts say which node the server ran on (`server_host`) and what the sandbox printed (`output`)."""

    name = "sandbox_command"

    async def init(self, ctx: JobContext) -> None:
        await ctx.start_sandbox()

    async def run(self, ctx: JobContext) -> None:
        a, b = int(ctx.instance.get("a", 6)), int(ctx.instance.get("b", 7))
        await ctx.llm.start([{"role": "user", "content": f"What is {a} * {b}?"}])
        await ctx.llm.generate()
        done = await ctx.sandbox.bash(f"echo $(( {a} * {b} ))", timeout=30)
        ctx.artifacts.update(output=done.output.strip(), exit_code=done.exit_code, server_host=os.uname().nodename)

    async def eval(self, ctx: JobContext) -> float:
        a, b = int(ctx.instance.get("a", 6)), int(ctx.instance.get("b", 7))
        return 1.0 if ctx.artifacts.get("output") == str(a * b) else 0.0

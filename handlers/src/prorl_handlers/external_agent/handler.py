"""ExternalAgentHandler: RUN runs the instance's command in a sandbox that reaches the job's gateway session;
EVAL runs the instance's scoring command in a fresh sandbox."""

from __future__ import annotations

import math
import shlex
from typing import Any

from prorl_handlers.external_agent.instance import ExternalAgentInstance
from prorl_handlers.harnesses.sandbox import harness_sandbox, session_defaults
from prorl_handlers.instances import parse_instance
from prorl_server import AgentHandler, JobContext
from prorl_server.sandbox import Sandbox
from prorl_server.tool_server.errors import FileSystemError

MAX_COLLECT_BYTES = 1 << 20  # per collected file
OUTPUT_TAIL_CHARS = 4000
STAT_TIMEOUT_S = 30.0


class ExternalAgentHandler(AgentHandler):
    """Any OpenAI-speaking command as a task (see `prorl_handlers.external_agent`)."""

    name = "external_agent"
    instance_model = ExternalAgentInstance

    async def init(self, ctx: JobContext) -> None:
        """Read the instance."""
        ctx.state["task"] = parse_instance(ExternalAgentInstance, ctx.instance)

    async def run(self, ctx: JobContext) -> None:
        """Open the job's gateway session, start a sandbox reaching it, put the files there, run the command
        within the time budget, and collect the files EVAL gets."""
        task: ExternalAgentInstance = ctx.state["task"]
        options = task.session
        naming = {"model": options.model, "accept_any_model": options.accept_any_model}
        if task.harness is not None:  # the preset's, unless the instance says
            chosen = {key: value for key, value in naming.items() if key in options.model_fields_set}
            naming = {**session_defaults(task.harness), **chosen}
        access = await ctx.gateway_session(
            **naming,
            side_calls=options.side_calls,
            reward_chains=options.reward_chains,
        )
        setup = None
        if task.harness is None:
            sandbox, command = await ctx.start_sandbox(gateway=access), task.command or ""
        else:
            setup = harness_sandbox(task.harness, ctx.default_sandbox_spec, task.task or "", access, task.max_turns)
            sandbox, command = await ctx.start_sandbox(setup.spec, gateway=access), setup.command
            await setup.prepare(sandbox)
        await _put(sandbox, task.files)
        done = await sandbox.bash(command, timeout=task.time_budget_s)
        ctx.artifacts["agent"] = {
            "exit_code": done.exit_code,
            "timed_out": done.timed_out,
            "output": done.output[-OUTPUT_TAIL_CHARS:],
        }
        if setup is not None:
            ctx.artifacts["harness"] = await setup.report(sandbox)
        ctx.artifacts["files"], missing = await _collect(sandbox, task.collect)
        if missing:
            ctx.artifacts["missing_files"] = missing

    async def eval(self, ctx: JobContext) -> dict[str, Any]:
        """Run the scoring command in a fresh sandbox with the score's files and the collected ones."""
        task: ExternalAgentInstance = ctx.state["task"]
        sandbox = await ctx.start_sandbox()
        await _put(sandbox, {**ctx.artifacts.get("files", {}), **task.score.files})
        command = task.score.command if task.score.reward == "exit_code" else f"( {task.score.command}\n) 2>/dev/null"
        done = await sandbox.bash(command, timeout=task.score.timeout_s)
        details: dict[str, Any] = {
            "score_exit_code": done.exit_code,
            "score_timed_out": done.timed_out,
            "score_output": done.output[-OUTPUT_TAIL_CHARS:],
        }
        if task.score.reward == "exit_code":
            return {"reward": 1.0 if done.exit_code == 0 else 0.0, **details}
        lines = done.output.strip().splitlines()
        try:
            reward = float(lines[-1]) if lines and done.exit_code == 0 else math.nan
        except ValueError:
            reward = math.nan
        if not math.isfinite(reward):
            return {"reward": 0.0, "score_error": "the score command printed no number on its last line", **details}
        return {"reward": reward, **details}


async def _put(sandbox: Sandbox, files: dict[str, str]) -> None:
    for path, text in files.items():
        await sandbox.write_file(path, text)


async def _collect(sandbox: Sandbox, paths: list[str]) -> tuple[dict[str, str], list[str]]:
    """The text of each file (at most MAX_COLLECT_BYTES each), and the paths missing or too large."""
    files: dict[str, str] = {}
    missing: list[str] = []
    for path in paths:
        size = await sandbox.bash(f"stat -L -c %s -- {shlex.quote(path)}", timeout=STAT_TIMEOUT_S)
        if size.exit_code != 0 or not size.output.strip().isdigit() or int(size.output.strip()) > MAX_COLLECT_BYTES:
            missing.append(path)
            continue
        try:
            files[path] = await sandbox.read_file(path)
        except FileSystemError:  # a directory, unreadable, not text
            missing.append(path)
    return files, missing

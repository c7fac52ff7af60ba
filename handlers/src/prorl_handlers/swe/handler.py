"""SWEHandler: INIT checks the repository out in a sandbox, RUN lets the agent fix it and takes its `git diff`,
EVAL applies that diff in a fresh sandbox and runs the instance's tests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prorl_handlers.swe.evaluate import evaluate
from prorl_handlers.swe.instance import DATA_DIR, SWEInstance
from prorl_handlers.swe.repo import RepositoryError, extract_patch, materialize, repo_dir
from prorl_server import AgentHandler, JobContext
from prorl_server.agent import AgentLoop, bash_tool, editor_tool, submit_tool
from prorl_server.sandbox import Sandbox

REPOS_DIR = DATA_DIR / "repos"
DEFAULT_MAX_TURNS = 30
DEFAULT_TEST_TIMEOUT_S = 300.0
INSTRUCTIONS = (
    "You are a software engineer fixing an issue in a Python repository, in a sandbox without network access. "
    "Explore the code with the tools, find the cause of the issue and fix it in the source code; run "
    "`python3 -m pytest` to check your work. Hidden tests will check the fix, so keep every behaviour the issue "
    "does not ask to change. When you are done, call submit: your answer is your changes to the repository."
)


def task_prompt(task: SWEInstance) -> str:
    """The first user message: where the repository is, and the issue."""
    return (
        f"The repository {task.repo} is checked out at {task.workdir} (git, commit {task.base_commit[:12]}). "
        f"Resolve this issue:\n\n<issue>\n{task.problem_statement.strip()}\n</issue>"
    )


class SWEHandler(AgentHandler):
    """Repository repair, SWE-bench style, on repositories shipped with the package (see `prorl_handlers.swe`).

    Agent settings: `max_turns` (default 30), `max_context_length`, `tool_timeout`, `system_prompt`, and
    `test_timeout` (seconds for EVAL's test run, default 300). Where repositories are is the server's
    choice, not a request's: the constructor's `repos_dir` (default: the shipped ones).
    """

    name = "swe"
    agent_config_keys = frozenset({"test_timeout"})

    def __init__(self, repos_dir: str | Path | None = None) -> None:
        self.repos_dir = Path(repos_dir) if repos_dir else REPOS_DIR
        tools = [bash_tool(), editor_tool(), submit_tool(description="Submit your fix; this ends the episode.")]
        self.loop = AgentLoop(tools, INSTRUCTIONS, max_turns=DEFAULT_MAX_TURNS)

    async def init(self, ctx: JobContext) -> None:
        """Read the instance; check its repository out at base_commit in the job's sandbox."""
        ctx.state["task"] = SWEInstance.from_dict(ctx.instance)
        await self._checkout(ctx)

    async def run(self, ctx: JobContext) -> None:
        """The agent loop on the issue; then the checkout's diff is `artifacts["patch"]` (empty if git fails)."""
        task: SWEInstance = ctx.state["task"]
        await self.loop.run(ctx, task_prompt(task))
        try:
            ctx.artifacts["patch"] = await extract_patch(ctx.sandbox, task.workdir, task.base_commit)
        except RepositoryError as exc:  # the agent broke the checkout: score an empty patch
            ctx.artifacts["patch"], ctx.artifacts["patch_error"] = "", str(exc)

    async def eval(self, ctx: JobContext) -> dict[str, Any]:
        """Apply the patch and the test patch in a fresh sandbox; reward 1.0 when all the instance's tests pass."""
        sandbox = await self._checkout(ctx)
        timeout = float(ctx.agent_config.get("test_timeout") or DEFAULT_TEST_TIMEOUT_S)
        return await evaluate(sandbox, ctx.state["task"], str(ctx.artifacts.get("patch") or ""), timeout)

    async def _checkout(self, ctx: JobContext) -> Sandbox:
        task: SWEInstance = ctx.state["task"]
        root = repo_dir(self.repos_dir, task.repo)
        sandbox = await ctx.start_sandbox()
        await materialize(sandbox, root, task.workdir, task.base_commit)
        return sandbox

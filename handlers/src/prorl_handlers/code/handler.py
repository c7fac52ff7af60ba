"""The code handler: the agent writes a Python program that reads stdin and writes stdout.

Instance: ``{"data_source": "code", "id": ..., "statement": ..., "tests": [{"stdin": ..., "stdout": ...}]}``,
optionally ``solution_path`` (default /workspace/solution.py), ``time_limit_s`` (2) and ``memory_mb`` (256).
The tests are hidden: the agent sees the statement only. RUN ends by reading the program into
``artifacts["solution"]``; EVAL judges it in a fresh sandbox the agent never touched (`judge.judge`).
"""

from __future__ import annotations

import json
from importlib import resources
from typing import Any

from pydantic import BaseModel, Field

from prorl_handlers.code.judge import judge
from prorl_handlers.instances import parse_instance
from prorl_server import AgentHandler, JobContext
from prorl_server.agent import AgentLoop, bash_tool, editor_tool, submit_tool
from prorl_server.tool_server.errors import FileMissing, IsADirectory

INSTRUCTIONS = (
    "Solve the programming problem with a Python 3 program that reads the input from stdin and writes the "
    "answer to stdout. Write it with the `str_replace_editor` tool (or bash), run it on the example with bash, "
    "fix it until it is right, then call `submit`. It is judged on hidden tests with time and memory limits."
)


class HiddenTest(BaseModel):
    """One hidden test."""

    stdin: str
    stdout: str


class CodeTask(BaseModel):
    """The fields of an instance the handler reads."""

    statement: str = Field(min_length=1)
    tests: list[HiddenTest] = Field(min_length=1)
    solution_path: str = Field(default="/workspace/solution.py", pattern=r"^/")
    time_limit_s: float = Field(default=2.0, gt=0, le=60)
    memory_mb: int = Field(default=256, ge=32)

    def prompt(self) -> str:
        """The task as the agent sees it."""
        return (
            f"{self.statement.strip()}\n\nSave your program as {self.solution_path}. Limits per test: "
            f"{self.time_limit_s:g} s, {self.memory_mb} MB."
        )


class CodeHandler(AgentHandler):
    """RUN: bash + editor agent loop until `submit`; EVAL: reward 1.0 when every hidden test passes."""

    name = "code"
    loop = AgentLoop([bash_tool(), editor_tool(), submit_tool()], INSTRUCTIONS)

    async def init(self, ctx: JobContext) -> None:
        """Validate the instance (a bad one fails the job here), then start the agent's sandbox."""
        ctx.state["task"] = parse_instance(CodeTask, ctx.instance)
        await ctx.start_sandbox()

    async def run(self, ctx: JobContext) -> None:
        """The agent loop, then the program file into `artifacts["solution"]` ("" when there is none)."""
        task: CodeTask = ctx.state["task"]
        await self.loop.run(ctx, task.prompt())
        try:
            ctx.artifacts["solution"] = await ctx.sandbox.read_file(task.solution_path)
        except (FileMissing, IsADirectory):  # no program written: it is judged as empty
            ctx.artifacts["solution"] = ""

    async def eval(self, ctx: JobContext) -> dict[str, Any]:
        """Judge the solution in a fresh sandbox: reward 1.0 if all tests pass, with passed/total/failure."""
        task: CodeTask = ctx.state["task"]
        tests = [t.model_dump() for t in task.tests]
        sandbox = await ctx.start_sandbox()
        solution = ctx.artifacts.get("solution", "")
        limits = {"time_limit_s": task.time_limit_s, "memory_mb": task.memory_mb}
        verdict = await judge(sandbox, solution, tests, path=task.solution_path, **limits)
        return {"reward": 1.0 if verdict["passed"] == verdict["total"] else 0.0, **verdict}


def load_problems() -> list[dict[str, Any]]:
    """The shipped problem set (`data/problems.jsonl`): instances ready to post, with `reference` solutions."""
    text = resources.files(__package__).joinpath("data/problems.jsonl").read_text(encoding="utf-8")
    return [json.loads(line) for line in text.splitlines() if line.strip()]

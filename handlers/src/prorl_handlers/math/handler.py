"""The math handler: the agent computes with an IPython kernel in its sandbox and submits an answer.

Instance: ``{"data_source": "math", "id": "...", "question": "...", "answer": "42"}``. EVAL compares the
submitted answer with ``answer`` (see `grading`): as exact numbers on the host, else with sympy in a fresh
sandbox, whose ``python3`` needs sympy (the host root of the bubblewrap and local runtimes has it).
"""

from __future__ import annotations

import json
from importlib import resources
from typing import Any

from pydantic import BaseModel, Field

from prorl_handlers.instances import parse_instance
from prorl_handlers.math.grading import grade
from prorl_server import AgentHandler, JobContext
from prorl_server.agent import AgentLoop, ipython_tool, submit_tool

INSTRUCTIONS = (
    "Solve the math problem. You can run Python code with the `ipython` tool to compute or check your work. "
    "When you are sure, call `submit` with the final answer only: a number (42, -3/4, 0.25) or a simplified "
    "expression (2*x + 1, sqrt(5), 9*pi), without units or words."
)
ANSWER = {
    "type": "object",
    "properties": {"answer": {"type": "string", "description": "the final answer only, e.g. 42, 3/8 or x + 3"}},
    "required": ["answer"],
}


class MathTask(BaseModel):
    """The fields of an instance the handler reads."""

    question: str = Field(min_length=1)
    answer: str | int | float


class MathHandler(AgentHandler):
    """RUN: an IPython agent loop until `submit`; EVAL: reward 1.0 when the answer equals the reference."""

    name = "math"
    loop = AgentLoop([ipython_tool(), submit_tool(parameters=ANSWER)], INSTRUCTIONS)

    async def init(self, ctx: JobContext) -> None:
        """Validate the instance (a bad one fails the job here), then start the agent's sandbox."""
        ctx.state["task"] = parse_instance(MathTask, ctx.instance)
        await ctx.start_sandbox()

    async def run(self, ctx: JobContext) -> None:
        """The agent loop; the submitted answer (None without a submission) goes to `artifacts["answer"]`."""
        result = await self.loop.run(ctx, ctx.state["task"].question)
        ctx.artifacts["answer"] = (result.submission or {}).get("answer")

    async def eval(self, ctx: JobContext) -> dict[str, Any]:
        """Reward 1.0 or 0.0, with how the answer was compared."""
        verdict = await grade(ctx.artifacts.get("answer"), str(ctx.state["task"].answer), ctx.start_sandbox)
        return {"reward": 1.0 if verdict["correct"] else 0.0, **verdict}


def load_problems() -> list[dict[str, Any]]:
    """The shipped problem set (`data/problems.jsonl`): instances ready to post."""
    text = resources.files(__package__).joinpath("data/problems.jsonl").read_text(encoding="utf-8")
    return [json.loads(line) for line in text.splitlines() if line.strip()]

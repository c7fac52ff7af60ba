"""The judged_answer handler: a free-form question, the answer judged against a reference by an LLM judge.

Instance: ``{"data_source": "judged_answer", "id": "...", "question": "Why does ice float on water?",
"reference": "Ice is less dense than liquid water."}``. RUN asks the question in one chat turn (no tools, no
sandbox). EVAL asks the server's LLM judge (`--judge-server`, reached as ``ctx.judge``) whether the answer
means the same as the reference, and reads its ``VERDICT: correct`` or ``VERDICT: incorrect``: reward 1.0
for correct, else 0.0. A judge reply without a verdict scores 0.0 with ``verdict: null`` in the result's
``eval`` details (with the end of the judge's text), so a trainer can drop such samples. A server without a
judge fails the job in EVAL with a JudgeUnavailable error saying how to configure one.

``agent_config`` key: ``judge_max_tokens`` (default 512), the most tokens the judge may answer with.

The shipped set (`data/questions.jsonl`) holds questions whose right answers can be worded many ways, which
a string match would score wrong.
"""

from __future__ import annotations

import json
from importlib import resources
from typing import Any

from pydantic import BaseModel, Field

from prorl_server import AgentHandler, JobContext
from prorl_server.llm import parse_verdict

JUDGE_SYSTEM = "You grade answers to questions. You are strict about meaning and lenient about wording."
JUDGE_TEMPLATE = """Question: {question}

Reference answer: {reference}

Answer to grade: {answer}

Does the answer to grade say the same as the reference answer (extra correct detail is fine; a wrong or \
missing key fact is not)? Explain in at most two sentences, then end with a line that is exactly \
"VERDICT: correct" or "VERDICT: incorrect"."""
MAX_ANSWER_CHARS = 4000  # of the policy's answer shown to the judge (the rest is cut and marked)
REPLY_TAIL_CHARS = 500  # of a judge reply without a verdict, kept in the eval details


class JudgedAnswerTask(BaseModel):
    """The fields of an instance the handler reads."""

    question: str = Field(min_length=1)
    reference: str = Field(min_length=1)


def judge_prompt(task: JudgedAnswerTask, answer: str) -> str:
    """What the judge is asked about one answer (cut to MAX_ANSWER_CHARS)."""
    if len(answer) > MAX_ANSWER_CHARS:
        answer = answer[:MAX_ANSWER_CHARS] + " [...cut]"
    return JUDGE_TEMPLATE.format(question=task.question, reference=task.reference, answer=answer or "(no answer)")


class JudgedAnswerHandler(AgentHandler):
    """RUN: one chat turn; EVAL: the LLM judge compares the answer with the reference."""

    name = "judged_answer"
    instance_model = JudgedAnswerTask
    agent_config_keys = frozenset({"judge_max_tokens"})

    async def run(self, ctx: JobContext) -> None:
        """Ask the question; the reply's text goes to `artifacts["answer"]`."""
        task = JudgedAnswerTask.model_validate(ctx.instance)
        await ctx.llm.start([{"role": "user", "content": task.question}])
        reply = await ctx.llm.generate()
        ctx.artifacts["answer"] = reply.text.strip()

    async def eval(self, ctx: JobContext) -> dict[str, Any]:
        """Reward 1.0 when the judge's verdict is `correct`, else 0.0, with the verdict and the judge's usage."""
        task = JudgedAnswerTask.model_validate(ctx.instance)
        max_tokens = int(ctx.agent_config.get("judge_max_tokens", 512))
        prompt = judge_prompt(task, str(ctx.artifacts.get("answer", "")))
        reply = await ctx.judge.ask(prompt, system=JUDGE_SYSTEM, max_tokens=max_tokens)
        verdict = parse_verdict(reply.text)
        details: dict[str, Any] = {
            "reward": 1.0 if verdict == "correct" else 0.0,
            "verdict": verdict,
            "judge_model": reply.model,
            "judge_usage": reply.usage.model_dump() if reply.usage is not None else None,
        }
        if verdict is None:
            details["judge_reply_tail"] = reply.text[-REPLY_TAIL_CHARS:]
        return details


def load_questions() -> list[dict[str, Any]]:
    """The shipped question set (`data/questions.jsonl`): instances ready to post."""
    text = resources.files(__package__).joinpath("data/questions.jsonl").read_text(encoding="utf-8")
    return [json.loads(line) for line in text.splitlines() if line.strip()]

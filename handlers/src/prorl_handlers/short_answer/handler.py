"""The short_answer handler: a question with a one-word or one-number answer, in plain chat turns.

Instance: ``{"data_source": "short_answer", "id": "...", "question": "What color is the sky? One word.",
"answer": "blue"}``. RUN asks the question (no tools, no sandbox); with ``max_turns`` > 1 a wrong reply is
told so and the model tries again. EVAL gives reward 1.0 when the expected answer appears in the last reply
as a whole word or number, ignoring case ("The sky is Blue." is right for ``blue``; "24" is not right for
``4``), else 0.0.

`learning_tasks(split)` is the task the learning demo trains on (`examples/train_grpo.py`): "Reply with
just the word: W" over two disjoint word lists (`data/echo_words.json`: train and held out), which the
untrained model at temperature 1 gets right about one time in seven on its first try. The shipped
question set (`data/questions.jsonl`) mixes questions SmolLM2-135M-Instruct at temperature 1 answers right
some of the time with ones it almost never gets, so groups of samples per question come out
informative (reward variance > 0) for part of the set and zero-variance for the rest: something for
DAPO-style dynamic sampling to filter.
"""

from __future__ import annotations

import json
import re
from importlib import resources
from typing import Any, Literal

from pydantic import BaseModel, Field

from prorl_handlers.instances import parse_instance
from prorl_server import AgentHandler, JobContext

RETRY = "That is not right. Try once more: reply with just the answer."
ECHO_QUESTION = "Reply with just the word: {word}"


class ShortAnswerTask(BaseModel):
    """The fields of an instance the handler reads."""

    question: str = Field(min_length=1)
    answer: str | int = Field()

    def expected(self) -> str:
        """The reference answer as text, stripped (never empty)."""
        text = str(self.answer).strip()
        if not text:
            raise ValueError("answer is empty")
        return text


def contains_answer(reply: str | None, answer: str) -> bool:
    """True when `answer` appears in `reply` as a whole word or number, ignoring case."""
    if not reply:
        return False
    pattern = rf"(?<![0-9a-z]){re.escape(answer.strip().lower())}(?![0-9a-z])"
    return re.search(pattern, reply.lower()) is not None


class ShortAnswerHandler(AgentHandler):
    """RUN: ask, and with `max_turns` > 1 retry after a wrong reply; EVAL: reward 1.0 when the answer appears."""

    name = "short_answer"

    async def init(self, ctx: JobContext) -> None:
        """Validate the instance (a bad one fails the job here); no sandbox is needed."""
        task = parse_instance(ShortAnswerTask, ctx.instance)
        try:
            ctx.state["expected"] = task.expected()
        except ValueError as exc:
            raise ValueError(f"invalid short_answer instance: {exc}") from None
        ctx.state["task"] = task

    async def run(self, ctx: JobContext) -> None:
        """One turn per try; the last reply's text goes to `artifacts["answer"]`."""
        await ctx.llm.start([{"role": "user", "content": ctx.state["task"].question}])
        max_turns = max(1, int(ctx.agent_config.get("max_turns", 1)))
        for turn in range(max_turns):
            reply = await ctx.llm.generate()
            ctx.artifacts["answer"] = reply.text.strip()
            if contains_answer(reply.text, ctx.state["expected"]) or turn + 1 == max_turns:
                break
            await ctx.llm.add_messages([{"role": "user", "content": RETRY}])

    async def eval(self, ctx: JobContext) -> dict[str, Any]:
        """Reward 1.0 or 0.0, with the expected answer and the number of turns."""
        correct = contains_answer(ctx.artifacts.get("answer"), ctx.state["expected"])
        return {
            "reward": 1.0 if correct else 0.0,
            "correct": correct,
            "expected": ctx.state["expected"],
            "turns": len(ctx.trajectory.turns),
        }


def learning_tasks(split: Literal["train", "held_out"]) -> list[dict[str, Any]]:
    """The learning demo's instances: "Reply with just the word: W" for every word of the split
    (`data/echo_words.json`; the two splits share no word)."""
    text = resources.files(__package__).joinpath("data/echo_words.json").read_text(encoding="utf-8")
    words = json.loads(text)[split]
    return [
        {
            "data_source": "short_answer",
            "id": f"echo-{split}-{word}",
            "question": ECHO_QUESTION.format(word=word),
            "answer": word,
        }
        for word in words
    ]


def load_questions() -> list[dict[str, Any]]:
    """The shipped question set (`data/questions.jsonl`): instances ready to post."""
    text = resources.files(__package__).joinpath("data/questions.jsonl").read_text(encoding="utf-8")
    return [json.loads(line) for line in text.splitlines() if line.strip()]

"""The file_question handler: the answer is in a file of the sandbox, which the model reads with `bash`.

Instance: ``{"data_source": "file_question", "id": "...", "question": "What word is written in
/workspace/note.txt?", "files": {"note.txt": "harbor\\n"}, "answer": "harbor"}``. INIT starts a sandbox and
writes `files` under `/workspace` (names relative to it). RUN is the shared agent loop with the `bash` tool
only, after three worked examples (a question, its `cat` call, the output, the one-word reply): the model
calls the tool as often as it likes (within `max_turns`, default 2: a call, then the reply), and its first
turn without a tool call is its answer. EVAL gives reward 1.0 when the expected answer appears in that reply
as a whole word (ignoring case); 0.5 (`READ_CREDIT`) when it does not but a command's output showed it (the
file was read: the skill the tool-use task teaches, credited so that an untrained model's groups carry
signal); else 0.0. An episode that ends on a tool call has no answer.

`learning_tasks(split)` is the tool-use learning task (`examples/train_grpo.py --task file_question`): one
word per instance, in one of four file names, over two disjoint word lists (`data/words.json`: train and
held out); the question names the command ("What word is written in /workspace/note.txt? Run: cat
/workspace/note.txt"). The model cannot know the word without running it, so every reward is a tool call's.
Untrained SmolLM2-135M-Instruct at temperature 1 gets it right 20% of the time (19 of 95 held-out samples):
what it lacks is the call's format, which it writes malformed or fills with the tool's schema most of the
time.
"""

from __future__ import annotations

import json
from importlib import resources
from pathlib import PurePosixPath
from typing import Any, Literal

from pydantic import BaseModel, Field, field_validator

from prorl_handlers.instances import parse_instance
from prorl_handlers.short_answer import contains_answer
from prorl_server import AgentHandler, JobContext
from prorl_server.agent import AgentLoop, bash_tool

WORKSPACE = "/workspace"
MAX_FILES = 16
MAX_FILE_BYTES = 64 * 1024
INSTRUCTIONS = (
    "You are in a Linux shell. Read files with the bash tool (for example: cat /workspace/note.txt). "
    "When you know the answer, reply with just the answer and no tool call."
)
QUESTION = "What word is written in {path}? Run: cat {path}"
EXAMPLE_FILES = {"example.txt": "lemon", "list.txt": "river", "name.txt": "candle"}


def _worked(name: str, word: str) -> list[dict[str, str]]:
    """One worked episode: the question, its `cat` call in Hermes' format, the output, the one-word reply."""
    call = {"name": "bash", "arguments": {"command": f"cat {WORKSPACE}/{name}"}}
    return [
        {"role": "user", "content": QUESTION.format(path=f"{WORKSPACE}/{name}")},
        {"role": "assistant", "content": f"<tool_call>\n{json.dumps(call)}\n</tool_call>"},
        {"role": "tool", "content": f"{word}\n"},
        {"role": "assistant", "content": word},
    ]


EXAMPLES = [message for name, word in EXAMPLE_FILES.items() for message in _worked(name, word)]
"""The worked episodes before each question (the messages after the system prompt)."""
FILE_NAMES = ("note.txt", "secret.txt", "word.txt", "answer.txt")
READ_CREDIT = 0.5
"""The reward of an episode whose command showed the answer but whose reply does not hold it (a success, with
`prorl-server eval`'s pass threshold 1.0, is the answer only)."""


class FileQuestionTask(BaseModel):
    """The fields of an instance the handler reads."""

    question: str = Field(min_length=1)
    files: dict[str, str] = Field(min_length=1, max_length=MAX_FILES)
    answer: str = Field(min_length=1, pattern=r"\S")

    @field_validator("files")
    @classmethod
    def _relative_and_bounded(cls, files: dict[str, str]) -> dict[str, str]:
        for name, content in files.items():
            path = PurePosixPath(name)
            if not name or path.is_absolute() or ".." in path.parts or name.startswith("."):
                raise ValueError(f"file name {name!r} must be a relative path inside {WORKSPACE}")
            if len(content.encode()) > MAX_FILE_BYTES:
                raise ValueError(f"file {name!r} is over {MAX_FILE_BYTES} bytes")
        return files


class FileQuestionHandler(AgentHandler):
    """RUN: a bash agent loop until a reply without a tool call; EVAL: reward 1.0 when it holds the answer."""

    name = "file_question"
    loop = AgentLoop([bash_tool()], INSTRUCTIONS, max_turns=2, on_no_tool_call="finish", tool_format="hermes")

    async def init(self, ctx: JobContext) -> None:
        """Validate the instance (a bad one fails the job here), start the sandbox and write the files."""
        task = parse_instance(FileQuestionTask, ctx.instance)
        ctx.state["task"] = task
        sandbox = await ctx.start_sandbox()
        for name, content in task.files.items():
            await sandbox.write_file(f"{WORKSPACE}/{name}", content)

    async def run(self, ctx: JobContext) -> None:
        """The agent loop; the reply that ends it (None when it ended otherwise) goes to `artifacts["answer"]`."""
        result = await self.loop.run(ctx, [*EXAMPLES, {"role": "user", "content": ctx.state["task"].question}])
        answered = result.stop_reason == "no_tool_call" and ctx.trajectory.turns
        ctx.artifacts["answer"] = ctx.trajectory.turns[-1].text.strip() if answered else None

    async def eval(self, ctx: JobContext) -> dict[str, Any]:
        """Reward 1.0 for the answer; READ_CREDIT when a command's output showed it but the reply lacks it."""
        task: FileQuestionTask = ctx.state["task"]
        correct = contains_answer(ctx.artifacts.get("answer"), task.answer)
        episode = ctx.trajectory.messages[len(EXAMPLES) + 2 :]  # after the system prompt, examples and question
        read = any(m["role"] == "tool" and contains_answer(str(m["content"]), task.answer) for m in episode)
        agent = ctx.artifacts.get("agent", {})
        return {
            "reward": 1.0 if correct else READ_CREDIT if read else 0.0,
            "correct": correct,
            "read": read,
            "expected": task.answer,
            "tool_calls": agent.get("tool_calls", 0),
        }


def learning_tasks(split: Literal["train", "held_out"]) -> list[dict[str, Any]]:
    """The tool-use learning task's instances: the word of each split (`data/words.json`; the two splits share
    no word) in `/workspace/<name>`, the names taking turns."""
    text = resources.files(__package__).joinpath("data/words.json").read_text(encoding="utf-8")
    words = json.loads(text)[split]
    tasks = []
    for i, word in enumerate(words):
        name = FILE_NAMES[i % len(FILE_NAMES)]
        tasks.append(
            {
                "data_source": "file_question",
                "id": f"file-{split}-{word}",
                "question": QUESTION.format(path=f"{WORKSPACE}/{name}"),
                "files": {name: f"{word}\n"},
                "answer": word,
            }
        )
    return tasks

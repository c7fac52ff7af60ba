"""The `harbor` instance: which task folder, and which agent runs it."""

from __future__ import annotations

from pathlib import PurePosixPath
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from prorl_handlers.harbor.task import MAX_NAME_CHARS
from prorl_handlers.harnesses import HARNESSES

MAX_FILES = 256
AGENT_DIR = "/tmp/harbor-agent"  # where `files` go: not the working directory, which the tests may list


class HarborInstance(BaseModel):
    """An instance of `harbor` (unknown fields, such as an id, are kept out of the way)."""

    model_config = ConfigDict(extra="ignore")

    task: str = Field(
        min_length=1, max_length=MAX_NAME_CHARS, description="The task folder, relative to the tasks directory."
    )
    agent: Literal["loop", "command", "harness", "oracle"] = Field(
        default="loop",
        description="loop: the built-in agent loop (bash, editor, submit) with the instruction as the user "
        "message; command: `command` through the job's gateway session; harness: the preset `harness` on the "
        "instruction, through the job's gateway session; oracle: the task's solution/solve.sh.",
    )
    harness: str | None = Field(default=None, description="agent=harness: a harness preset (docs/harnesses.md).")
    command: str | None = Field(
        default=None, min_length=1, description="agent=command: a bash command, the instruction in $HARBOR_INSTRUCTION."
    )
    files: dict[str, str] = Field(
        default_factory=dict, max_length=MAX_FILES, description=f"agent=command: path under {AGENT_DIR} -> text."
    )

    @model_validator(mode="after")
    def _agent_fields(self) -> HarborInstance:
        if (self.agent == "command") != (self.command is not None):
            raise ValueError("command is required with agent 'command' and only there")
        if (self.agent == "harness") != (self.harness is not None):
            raise ValueError("harness is required with agent 'harness' and only there")
        if self.harness is not None and self.harness not in HARNESSES:
            raise ValueError(f"unknown harness {self.harness!r} (known: {', '.join(HARNESSES)})")
        if self.files and self.agent != "command":
            raise ValueError("files are for agent 'command'")
        for path in self.files:
            parts = PurePosixPath(path).parts
            if not parts or path.startswith("/") or ".." in parts:
                raise ValueError(f"files: {path[:100]!r} is not a relative path under {AGENT_DIR}")
        return self

"""The `external_agent` instance: what to run in the sandbox, what to put there, how long, how to score."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

MAX_FILES = 256
MAX_PATH_CHARS = 1024


class Score(BaseModel):
    """How EVAL scores, in a fresh sandbox holding `files` and the files RUN collected."""

    model_config = ConfigDict(extra="forbid")

    command: str = Field(min_length=1, description="A bash command run in the working directory.")
    reward: Literal["exit_code", "stdout"] = Field(
        default="exit_code",
        description="exit_code: 1.0 when the command exits 0, else 0.0; stdout: the last line it prints, a number.",
    )
    files: dict[str, str] = Field(default_factory=dict, max_length=MAX_FILES, description="Path -> text.")
    timeout_s: float = Field(default=300.0, gt=0, le=3600)


class ExternalAgentInstance(BaseModel):
    """An instance of `external_agent` (unknown fields, such as an id, are kept out of the way)."""

    model_config = ConfigDict(extra="ignore")

    command: str = Field(min_length=1, description="The agent: a bash command run in the sandbox.")
    files: dict[str, str] = Field(
        default_factory=dict, max_length=MAX_FILES, description="Path (relative: to the working directory) -> text."
    )
    time_budget_s: float = Field(default=600.0, gt=0, le=24 * 3600, description="The command's time budget.")
    collect: list[str] = Field(
        default_factory=list, max_length=MAX_FILES, description="Files of the agent's sandbox EVAL gets."
    )
    score: Score

"""The `external_agent` instance: what to run in the sandbox, what to put there, how long, how to score."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from prorl_handlers.harnesses import HARNESSES
from prorl_server.protocol import MAX_NAME_CHARS, RewardChains, SideCalls

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


class SessionOptions(BaseModel):
    """The job's gateway session as the agent needs it (docs/gateway.md, "Chains")."""

    model_config = ConfigDict(extra="forbid")

    model: str | None = Field(
        default=None, min_length=1, max_length=MAX_NAME_CHARS, description="The agent's own name for the model."
    )
    accept_any_model: bool = Field(
        default=False, description="Answer any model name; names other than `model` and the served one are side calls."
    )
    side_calls: SideCalls = Field(
        default="record", description="Side calls recorded as chains of their own, or refused."
    )
    reward_chains: RewardChains = Field(default="main", description="The chains the reward belongs to.")


class ExternalAgentInstance(BaseModel):
    """An instance of `external_agent` (unknown fields, such as an id, are kept out of the way)."""

    model_config = ConfigDict(extra="ignore")

    command: str | None = Field(default=None, min_length=1, description="The agent: a bash command run in the sandbox.")
    harness: str | None = Field(default=None, description="Or a harness preset that runs `task` (docs/harnesses.md).")
    task: str | None = Field(default=None, min_length=1, max_length=1 << 20, description="The harness's prompt.")
    max_turns: int = Field(default=30, ge=1, le=10_000, description="The harness's model calls, where it can be told.")
    files: dict[str, str] = Field(
        default_factory=dict, max_length=MAX_FILES, description="Path (relative: to the working directory) -> text."
    )
    time_budget_s: float = Field(default=600.0, gt=0, le=24 * 3600, description="The command's time budget.")
    collect: list[str] = Field(
        default_factory=list, max_length=MAX_FILES, description="Files of the agent's sandbox EVAL gets."
    )
    score: Score
    session: SessionOptions = Field(default_factory=SessionOptions, description="The job's gateway session.")

    @model_validator(mode="after")
    def _a_command_or_a_harness(self) -> ExternalAgentInstance:
        if (self.command is None) == (self.harness is None):
            raise ValueError("give exactly one of `command` (a bash command) and `harness` (a preset, with `task`)")
        if self.harness is not None:
            if self.harness not in HARNESSES:
                raise ValueError(f"unknown harness {self.harness!r} (known: {', '.join(HARNESSES) or 'none'})")
            if self.task is None:
                raise ValueError(f"harness {self.harness!r} needs a `task`: the prompt it runs on")
        return self

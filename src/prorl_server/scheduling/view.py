"""What a scheduling policy knows about a live trajectory: `TrajectoryView`, and what a predictor says.

A view is a snapshot taken between turns (Heddle section 4.1 refines its estimate "after each step"): the
task's data source, a key naming its prompt (samples of one prompt share it), the prompt's length, the turns
and tokens generated so far and whether the trajectory has finished. Tokens so far count the response: model
tokens plus observation tokens (tool outputs), the prompt left out; a finished view's counts are the totals.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Sequence
from dataclasses import dataclass

from prorl_server.protocol import Trajectory


@dataclass(frozen=True, slots=True)
class TrajectoryView:
    """A trajectory as a policy sees it between turns."""

    data_source: str
    prompt_key: str
    prompt_len: int
    turns: int = 0
    model_tokens: int = 0
    observation_tokens: int = 0
    finished: bool = False

    def __post_init__(self) -> None:
        if min(self.prompt_len, self.turns, self.model_tokens, self.observation_tokens) < 0:
            raise ValueError(f"counts of a trajectory view cannot be negative: {self}")

    @property
    def tokens(self) -> int:
        """Response tokens so far: model plus observation tokens."""
        return self.model_tokens + self.observation_tokens


@dataclass(frozen=True, slots=True)
class Prediction:
    """What is still to come: expected response tokens and turns (0 for a finished trajectory)."""

    remaining_tokens: float
    remaining_turns: float


def prompt_key_of(prompt_ids: Sequence[int]) -> str:
    """A short digest of a prompt's token ids; the samples of one prompt get the same key."""
    return hashlib.blake2b(struct.pack(f"<{len(prompt_ids)}q", *prompt_ids), digest_size=12).hexdigest()


def view_of(trajectory: Trajectory, data_source: str, finished: bool = False) -> TrajectoryView:
    """The view of a trajectory as recorded so far (turns, and tokens split by `response_mask`)."""
    model_tokens = sum(trajectory.response_mask)
    return TrajectoryView(
        data_source=data_source,
        prompt_key=prompt_key_of(trajectory.prompt_ids),
        prompt_len=len(trajectory.prompt_ids),
        turns=len(trajectory.turns),
        model_tokens=model_tokens,
        observation_tokens=len(trajectory.response_mask) - model_tokens,
        finished=finished,
    )

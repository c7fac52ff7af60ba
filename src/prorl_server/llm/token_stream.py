"""TokenStream: the one writer of a trajectory's token stream (ids, mask and logprobs kept in step)."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

from prorl_server.protocol import Trajectory, TurnRecord


class TokenStream:
    """Owns the writes to a `Trajectory`: the prompt, the response tokens, the turns and the messages.

    Each append extends `response_ids`, `response_mask` and `response_logprobs` together under a lock, so
    the three lists have the same length by construction: sampled tokens carry mask 1 and their logprobs,
    observation tokens mask 0 and logprob 0.0. `snapshot()` copies the trajectory under the same lock, so
    a copy taken while a stage still appends (a cancel, a timeout) never sees half an append.
    """

    def __init__(self, trajectory: Trajectory) -> None:
        self.trajectory = trajectory
        self._lock = threading.Lock()
        self._model_tokens = sum(trajectory.response_mask)

    @property
    def started(self) -> bool:
        """True once a prompt or any response token is in the stream."""
        with self._lock:
            return bool(self.trajectory.prompt_ids or self.trajectory.response_ids)

    @property
    def token_ids(self) -> list[int]:
        """The whole context so far: prompt ids followed by response ids."""
        with self._lock:
            return self.trajectory.prompt_ids + self.trajectory.response_ids

    def context_len(self) -> int:
        """The length of `token_ids`, without copying them."""
        with self._lock:
            return len(self.trajectory.prompt_ids) + len(self.trajectory.response_ids)

    def set_prompt(self, ids: Sequence[int], messages: Sequence[dict[str, Any]] = ()) -> None:
        """Set the prompt ids and record the messages they were made from."""
        with self._lock:
            self.trajectory.prompt_ids = list(ids)
            self.trajectory.messages.extend(messages)

    def append_sampled(
        self, ids: Sequence[int], logprobs: Sequence[float], turn: TurnRecord, message: dict[str, Any]
    ) -> None:
        """Append one sampled turn: its ids (mask 1) with their logprobs, its record and its message."""
        if len(ids) != len(logprobs):
            raise ValueError(f"a sampled turn has {len(ids)} token ids but {len(logprobs)} logprobs")
        with self._lock:
            traj = self.trajectory
            traj.response_ids.extend(ids)
            traj.response_mask.extend([1] * len(ids))
            self._model_tokens += len(ids)
            traj.response_logprobs.extend(logprobs)
            traj.turns.append(turn)
            traj.messages.append(message)

    def append_observation(self, ids: Sequence[int], messages: Sequence[dict[str, Any]] = ()) -> None:
        """Append observation ids (mask 0, logprob 0.0) and record the messages they came from."""
        with self._lock:
            traj = self.trajectory
            traj.response_ids.extend(ids)
            traj.response_mask.extend([0] * len(ids))
            traj.response_logprobs.extend([0.0] * len(ids))
            traj.messages.extend(messages)

    def adopt(self, recorded: Trajectory) -> bool:
        """Take `recorded` (a trajectory written elsewhere: the job's gateway session) as this stream's, if
        nothing has been written here yet; True when it was taken. Its lists must be in step."""
        n = len(recorded.response_ids)
        if len(recorded.response_mask) != n or len(recorded.response_logprobs) != n:
            raise ValueError("a recorded trajectory's ids, mask and logprobs must have the same length")
        with self._lock:
            traj = self.trajectory
            if traj.prompt_ids or traj.response_ids or traj.turns:
                return False
            traj.prompt_ids = list(recorded.prompt_ids)
            traj.response_ids = list(recorded.response_ids)
            traj.response_mask = list(recorded.response_mask)
            traj.response_logprobs = list(recorded.response_logprobs)
            traj.turns = list(recorded.turns)
            traj.messages = list(recorded.messages)
            self._model_tokens = sum(traj.response_mask)
            return True

    def counts(self) -> tuple[int, int, int, int]:
        """(prompt tokens, turns, model tokens, observation tokens) so far, without copying anything."""
        with self._lock:
            traj = self.trajectory
            return (
                len(traj.prompt_ids),
                len(traj.turns),
                self._model_tokens,
                len(traj.response_ids) - self._model_tokens,
            )

    def snapshot(self) -> Trajectory:
        """A consistent copy of the trajectory as it is now."""
        with self._lock:
            traj = self.trajectory
            return Trajectory.model_construct(
                prompt_ids=list(traj.prompt_ids),
                response_ids=list(traj.response_ids),
                response_mask=list(traj.response_mask),
                response_logprobs=list(traj.response_logprobs),
                turns=list(traj.turns),
                messages=list(traj.messages),
            )

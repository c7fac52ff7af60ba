"""Finished results as padded tensors a trainer computes its loss on.

Each row's token stream is `prompt_ids + response_ids` (a result's trajectory, or a segment of a chain of
its gateway sessions), exactly as the engine saw and sampled it. The model predicts token `t + 1` from
position `t`, so every per-token tensor here has one column fewer than `input_ids` and is indexed by the
predicted token: `loss_mask[b, t]` is 1 only when token `t + 1` of row `b` was sampled by the model
(`response_mask` 1), never on prompt, observation or padding tokens, and `rollout_logprobs[b, t]` is the
engine's logprob of that token (0.0 elsewhere).
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from prorl_server.protocol import JobResult, Trajectory
from prorl_server.training.chains import ChainChoice, chain_trajectories


@dataclass(frozen=True)
class TokenBatch:
    """Rows of prompt + response ids, right-padded; per-token tensors are aligned with predicted tokens."""

    input_ids: torch.Tensor  # [B, T] long
    attention_mask: torch.Tensor  # [B, T] long: 1 on real tokens
    loss_mask: torch.Tensor  # [B, T-1] float: 1 where token t+1 was sampled by the model
    rollout_logprobs: torch.Tensor  # [B, T-1] float: the engine's logprob of token t+1 where sampled
    advantages: torch.Tensor  # [B] float: one per row

    @property
    def rows(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def model_tokens(self) -> int:
        """Tokens the loss is taken over (model-sampled ones)."""
        return int(self.loss_mask.sum().item())

    def select_rows(self, rows: torch.Tensor) -> TokenBatch:
        """The rows a boolean mask (or index tensor) picks, at full width."""
        return TokenBatch(
            input_ids=self.input_ids[rows],
            attention_mask=self.attention_mask[rows],
            loss_mask=self.loss_mask[rows],
            rollout_logprobs=self.rollout_logprobs[rows],
            advantages=self.advantages[rows],
        )

    def select(self, rows: slice) -> TokenBatch:
        """A micro-batch of consecutive rows, trimmed to its own longest row."""
        width = int(self.attention_mask[rows].sum(dim=1).max().item())
        return TokenBatch(
            input_ids=self.input_ids[rows, :width],
            attention_mask=self.attention_mask[rows, :width],
            loss_mask=self.loss_mask[rows, : width - 1],
            rollout_logprobs=self.rollout_logprobs[rows, : width - 1],
            advantages=self.advantages[rows],
        )


def group_advantages(rewards: Sequence[float], *, scale: bool = True, eps: float = 1e-6) -> list[float]:
    """GRPO's group-relative advantages: reward minus the group's mean, divided by its standard deviation
    (`scale=False` leaves the division out, as Dr. GRPO does). A group whose rewards are all equal gets 0s."""
    if not rewards:
        return []
    mean = statistics.fmean(rewards)
    std = statistics.pstdev(rewards)
    if std == 0.0:
        return [0.0 for _ in rewards]
    return [(r - mean) / (std + eps) if scale else r - mean for r in rewards]


def token_batch(
    results: Sequence[JobResult], advantages: Sequence[float], *, pad_id: int, chain: ChainChoice | None = None
) -> TokenBatch:
    """Pad `results` into a TokenBatch; `advantages` has one value per result.

    Without `chain`, a row per result: its trajectory. With `chain` (`"reward"`, `"main"` or a chain id; see
    `chain_trajectories`), a row per segment of that chain of the result's gateway sessions, each with the
    result's advantage. Raises ValueError for a result without response ids or whose mask and logprobs do not
    match its ids (prorl-server never returns one; a hand-made result might), or without the chain."""
    if len(results) != len(advantages):
        raise ValueError(f"{len(results)} results but {len(advantages)} advantages")
    if not results:
        raise ValueError("no results to batch")
    rows: list[tuple[Trajectory, float]] = []
    for result, advantage in zip(results, advantages, strict=True):
        trajectories = [result.trajectory] if chain is None else chain_trajectories(result, chain)
        for traj in trajectories:
            if not traj.prompt_ids or not traj.response_ids:
                raise ValueError(f"result {result.job_id} has no prompt or response ids (status {result.status.value})")
            if not len(traj.response_ids) == len(traj.response_mask) == len(traj.response_logprobs):
                raise ValueError(
                    f"result {result.job_id}: response ids, mask and logprobs differ in length "
                    f"({len(traj.response_ids)}, {len(traj.response_mask)}, {len(traj.response_logprobs)})"
                )
            rows.append((traj, advantage))
    width = max(len(traj.prompt_ids) + len(traj.response_ids) for traj, _ in rows)
    input_ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    attention = torch.zeros((len(rows), width), dtype=torch.long)
    loss_mask = torch.zeros((len(rows), width - 1), dtype=torch.float32)
    rollout = torch.zeros((len(rows), width - 1), dtype=torch.float32)
    for row, (traj, _) in enumerate(rows):
        stream = traj.prompt_ids + traj.response_ids
        start = len(traj.prompt_ids) - 1  # the column predicting the first response token
        end = start + len(traj.response_ids)
        input_ids[row, : len(stream)] = torch.tensor(stream, dtype=torch.long)
        attention[row, : len(stream)] = 1
        loss_mask[row, start:end] = torch.tensor(traj.response_mask, dtype=torch.float32)
        rollout[row, start:end] = torch.tensor(traj.response_logprobs, dtype=torch.float32) * loss_mask[row, start:end]
    return TokenBatch(
        input_ids=input_ids,
        attention_mask=attention,
        loss_mask=loss_mask,
        rollout_logprobs=rollout,
        advantages=torch.tensor([advantage for _, advantage in rows], dtype=torch.float32),
    )

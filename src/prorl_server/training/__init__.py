"""Trainer-side building blocks for learning from prorl-server's trajectories (torch on the trainer's side).

Needs the `train` extra (`pip install 'prorl-server[train]'`: torch, transformers, safetensors, matplotlib,
trl); the server never imports this package. What it holds:

- `token_batch`: finished results (their trajectories, or with `chain=` the segments of a chain of their
  gateway sessions: `chain_trajectories`) as padded tensors (ids, attention, loss mask over model-sampled tokens
  only, the rollout's logprobs aligned with the trainer's), and `group_advantages` (GRPO's).
- `token_logprobs`, `policy_loss`: the trainer's logprobs of the returned ids and a policy-gradient loss
  whose importance ratio is taken against the rollout's `response_logprobs` (PPO-style clip or truncated
  importance sampling).
- `logprob_mismatch`, `reencoded_mismatch`: training-inference mismatch on the returned ids, and what it
  would be had the trainer re-encoded the text.
- `CheckpointSync`: save the policy as safetensors and make the engines reload it (a weight-update pause,
  `POST /weights/update` with `reload`, resume), timed.
- `ProrlRollout` (in `prorl_server.training.trl_rollout`): TRL's `GRPOTrainer` with prorl-server as its
  rollout source.
"""

from __future__ import annotations

try:
    import torch  # noqa: F401
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        "prorl_server.training needs torch and transformers (the trainer's side, never the server's): "
        "pip install 'prorl-server[train]'"
    ) from exc

from prorl_server.training.batch import TokenBatch, group_advantages, token_batch
from prorl_server.training.chains import ChainChoice, chain_trajectories
from prorl_server.training.loss import LossConfig, LossStats, kl_to_reference, policy_loss, token_logprobs
from prorl_server.training.mismatch import Mismatch, logprob_mismatch, reencoded_mismatch
from prorl_server.training.weights import CheckpointSync, SyncTiming

__all__ = [
    "ChainChoice",
    "CheckpointSync",
    "LossConfig",
    "LossStats",
    "Mismatch",
    "SyncTiming",
    "TokenBatch",
    "chain_trajectories",
    "group_advantages",
    "kl_to_reference",
    "logprob_mismatch",
    "policy_loss",
    "reencoded_mismatch",
    "token_batch",
    "token_logprobs",
]

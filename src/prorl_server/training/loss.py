"""The trainer's logprobs of the returned ids and the policy-gradient loss over model-sampled tokens.

The importance ratio of each token is taken against the rollout's own logprob (`response_logprobs`, what
the engine sampled with), so a mismatch between engine and trainer, and staleness, are corrected for:

- `clip` (PPO-style): `-min(r * A, clip(r, 1 - eps_low, 1 + eps_high) * A)` with `r = pi / pi_rollout`;
- `tis` (truncated importance sampling): `-min(r, cap) * A * log pi`, the weight taken without gradient.

Both are averaged over every model-sampled token of the whole batch (DAPO's token-level mean), so a
micro-batch contributes `sum / tokens_in_batch` and gradients can be accumulated. Observation, prompt and
padding tokens never enter the loss: their `loss_mask` is 0.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Literal

import torch

from prorl_server.training.batch import TokenBatch

LossMode = Literal["clip", "tis"]


@dataclass(frozen=True)
class LossConfig:
    """Which correction, and its bounds."""

    mode: LossMode = "clip"
    clip_low: float = 0.2
    clip_high: float = 0.28  # DAPO's clip-higher: more room for low-probability tokens to grow
    tis_cap: float = 2.0

    def __post_init__(self) -> None:
        if self.mode not in ("clip", "tis"):
            raise ValueError(f"loss mode must be 'clip' or 'tis', not {self.mode!r}")
        if not (0 < self.clip_low < 1 and self.clip_high > 0 and self.tis_cap >= 1):
            raise ValueError("need 0 < clip_low < 1, clip_high > 0 and tis_cap >= 1")


@dataclass
class LossStats:
    """Sums over the model tokens of a batch (add micro-batches with `+=`), read as means."""

    tokens: float = 0.0
    loss_sum: float = 0.0
    ratio_sum: float = 0.0
    clipped: float = 0.0

    def __iadd__(self, other: LossStats) -> LossStats:
        self.tokens += other.tokens
        self.loss_sum += other.loss_sum
        self.ratio_sum += other.ratio_sum
        self.clipped += other.clipped
        return self

    @property
    def loss(self) -> float:
        return self.loss_sum / self.tokens if self.tokens else 0.0

    @property
    def mean_ratio(self) -> float:
        return self.ratio_sum / self.tokens if self.tokens else 1.0

    @property
    def clip_fraction(self) -> float:
        """Share of tokens whose ratio was clipped (clip) or capped (tis)."""
        return self.clipped / self.tokens if self.tokens else 0.0


def token_logprobs(model: torch.nn.Module, batch: TokenBatch) -> torch.Tensor:
    """log pi(token t+1 | tokens <= t) for every column: [B, T-1], float32 (gradients flow unless the caller
    runs it under `torch.no_grad()`). Columns before the first one the loss mask covers are 0: the model's
    output head runs only from there on (`logits_to_keep`), which saves its share of the compute on prompts."""
    columns = batch.loss_mask.shape[1]
    covered = batch.loss_mask.any(dim=0).nonzero()
    start = int(covered.min().item()) if covered.numel() and _keeps_logits(model) else 0
    kwargs = {"logits_to_keep": columns + 1 - start} if start else {}
    logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask, **kwargs).logits[:, :-1, :].float()
    targets = batch.input_ids[:, start + 1 :].unsqueeze(-1)
    picked = logits.gather(-1, targets).squeeze(-1) - torch.logsumexp(logits, dim=-1)
    if not start:
        return picked
    return torch.cat([picked.new_zeros((picked.shape[0], start)), picked], dim=1)


def _keeps_logits(model: torch.nn.Module) -> bool:
    """Whether the model's forward takes `logits_to_keep` (Hugging Face causal LMs do since 4.45)."""
    return "logits_to_keep" in inspect.signature(model.forward).parameters


def policy_loss(
    logprobs: torch.Tensor, batch: TokenBatch, config: LossConfig, *, tokens_in_batch: float
) -> tuple[torch.Tensor, LossStats]:
    """The loss of one micro-batch, already divided by `tokens_in_batch` (the model tokens of the whole
    batch), and its statistics. `logprobs` is `token_logprobs(model, batch)` with gradients."""
    mask = batch.loss_mask
    advantages = batch.advantages.unsqueeze(1)
    log_ratio = (logprobs - batch.rollout_logprobs) * mask
    ratio = torch.exp(log_ratio)
    if config.mode == "clip":
        clipped_ratio = ratio.clamp(1 - config.clip_low, 1 + config.clip_high)
        per_token = -torch.minimum(ratio * advantages, clipped_ratio * advantages)
        clipped = ((ratio * advantages) > (clipped_ratio * advantages)) & (mask > 0)
    else:
        weight = ratio.detach().clamp(max=config.tis_cap)
        per_token = -weight * advantages * logprobs
        clipped = (ratio.detach() > config.tis_cap) & (mask > 0)
    per_token = per_token * mask
    loss = per_token.sum() / max(tokens_in_batch, 1.0)
    stats = LossStats(
        tokens=float(mask.sum().item()),
        loss_sum=float(per_token.detach().sum().item()),
        ratio_sum=float((ratio.detach() * mask).sum().item()),
        clipped=float(clipped.sum().item()),
    )
    return loss, stats


def kl_to_reference(logprobs: torch.Tensor, reference: torch.Tensor, mask: torch.Tensor) -> float:
    """Mean over masked tokens of Schulman's k3 estimator of KL(pi || pi_ref) on the sampled tokens."""
    delta = (reference - logprobs) * mask
    k3 = (torch.exp(delta) - delta - 1) * mask
    tokens = float(mask.sum().item())
    return float(k3.sum().item()) / tokens if tokens else 0.0

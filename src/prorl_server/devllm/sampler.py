"""Sampling from one row of raw logits, with vLLM's semantics, and the raw logprobs vLLM reports.

Order as in vLLM: temperature scales the logits, then top-k, top-p and min-p filter, then one token is
drawn. A temperature below 1e-5 is greedy. The logprobs reported are log_softmax of the RAW logits
(vLLM's default `raw_logprobs`), whatever the sampling parameters.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

GREEDY_EPS = 1e-5  # vLLM's _SAMPLING_EPS


@dataclass(frozen=True)
class SamplingParams:
    """What decides the next token and when generation stops."""

    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stop_token_ids: frozenset[int] = field(default_factory=frozenset)
    ignore_eos: bool = False
    include_stop_str_in_output: bool = False
    logprobs: int | None = None  # alternatives per position to report; None reports none


class Sampler:
    """Draws tokens for one request; a seeded Sampler draws the same tokens from the same logits."""

    def __init__(self, params: SamplingParams) -> None:
        self.params = params
        self._rng = np.random.default_rng(None if params.seed is None else params.seed % 2**64)

    def sample(self, logits: npt.NDArray[np.float32]) -> int:
        """The next token id from a row of raw logits."""
        p = self.params
        if p.temperature < GREEDY_EPS:
            return int(np.argmax(logits))
        scaled = logits.astype(np.float64) / p.temperature
        keep = np.arange(scaled.shape[0])
        if 0 < p.top_k < scaled.shape[0]:
            keep = np.argpartition(scaled, -p.top_k)[-p.top_k :]
        scaled = scaled[keep]
        probs = np.exp(scaled - scaled.max())
        probs /= probs.sum()
        if p.top_p < 1.0:
            order = np.argsort(-probs, kind="stable")
            cumulative = np.cumsum(probs[order])
            n_keep = int(np.searchsorted(cumulative, p.top_p)) + 1
            chosen = order[:n_keep]
            keep, probs = keep[chosen], probs[chosen]
        if p.min_p > 0.0:
            mask = probs >= p.min_p * probs.max()
            keep, probs = keep[mask], probs[mask]
        cumulative = np.cumsum(probs)
        index = int(np.searchsorted(cumulative, self._rng.random() * cumulative[-1], side="right"))
        return int(keep[min(index, len(keep) - 1)])


def log_softmax(logits: npt.NDArray[np.float32]) -> npt.NDArray[np.float64]:
    """log_softmax of a row of raw logits, in float64."""
    row = logits.astype(np.float64)
    shifted = row - row.max()
    return shifted - np.log(np.exp(shifted).sum())


def top_logprobs(logprobs: npt.NDArray[np.float64], n: int) -> list[tuple[int, float]]:
    """The `n` most likely token ids with their logprobs, best first."""
    if n <= 0:
        return []
    ids = np.argpartition(logprobs, -n)[-n:]
    ids = ids[np.argsort(-logprobs[ids], kind="stable")]
    return [(int(i), float(logprobs[i])) for i in ids]

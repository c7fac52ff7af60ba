"""Training-inference mismatch: how far the trainer's logprobs of the sampled tokens are from the engine's.

With the same weights on both sides, the trainer's recomputed logprob of each sampled token differs from
the engine's `response_logprobs` only by numerics (kernels, batch shapes, float precision): that is
`logprob_mismatch`. A trainer that keeps only the text and re-encodes it gets other token ids wherever the
sampled tokenization is not the tokenizer's own, and then pairs its logprobs with the engine's by position:
`reencoded_mismatch` measures that, on the same results and the same model.

Both report the mean and max of |delta log p| and the share of tokens whose ratio exp(delta) leaves
[0.8, 1.25] (the band inside which clipped objectives treat a token as on-policy).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass

import torch

from prorl_server.protocol import JobResult
from prorl_server.training.batch import TokenBatch

BAND = (0.8, 1.25)


@dataclass(frozen=True)
class Mismatch:
    """|log p_trainer - log p_engine| over paired tokens."""

    tokens: int
    mean_abs: float
    max_abs: float
    out_of_band: float  # share of tokens with exp(delta) outside BAND
    turns: int = 0
    turns_retokenized: int = 0  # re-encoded only: turns whose ids differ from the sampled ones

    def as_dict(self) -> dict[str, float | int]:
        return asdict(self)


def _summarise(delta: torch.Tensor, *, turns: int = 0, retokenized: int = 0) -> Mismatch:
    if delta.numel() == 0:
        return Mismatch(0, 0.0, 0.0, 0.0, turns, retokenized)
    ratio = torch.exp(delta)
    outside = ((ratio < BAND[0]) | (ratio > BAND[1])).float().mean().item()
    return Mismatch(
        tokens=int(delta.numel()),
        mean_abs=float(delta.abs().mean().item()),
        max_abs=float(delta.abs().max().item()),
        out_of_band=float(outside),
        turns=turns,
        turns_retokenized=retokenized,
    )


def logprob_mismatch(trainer_logprobs: torch.Tensor, batch: TokenBatch) -> Mismatch:
    """The mismatch on the returned ids: `trainer_logprobs` is `token_logprobs(model, batch)`."""
    mask = batch.loss_mask > 0
    delta = (trainer_logprobs.detach() - batch.rollout_logprobs)[mask]
    return _summarise(delta.float())


@torch.no_grad()
def reencoded_mismatch(
    model: torch.nn.Module,
    encode: Callable[[str], list[int]],  # the tokenizer's own encoding of a text, without special tokens
    results: Sequence[JobResult],
    *,
    stop_ids: Iterable[int],
    pad_id: int,
) -> Mismatch:
    """The mismatch a trainer that re-encodes each turn's text would see: every turn's text is encoded
    again (its stop token kept, as a chat template renders it), scored after the same prefix the engine
    had, and paired by position with the engine's logprobs of the sampled ids."""
    stops = set(stop_ids)
    rows: list[list[int]] = []
    spans: list[tuple[int, int, list[float]]] = []
    turns = retokenized = 0
    for result in results:
        traj = result.trajectory
        stream = traj.prompt_ids + traj.response_ids
        for turn in traj.turns:
            if not turn.output_ids:
                continue
            ids = list(encode(turn.text))
            if turn.output_ids[-1] in stops and (not ids or ids[-1] != turn.output_ids[-1]):
                ids.append(turn.output_ids[-1])
            turns += 1
            retokenized += ids != turn.output_ids
            paired = min(len(ids), len(turn.logprobs))
            if paired == 0:
                continue
            context = stream[: turn.prompt_len]
            rows.append(context + ids)
            spans.append((len(context), paired, turn.logprobs[:paired]))
    if not rows:
        return _summarise(torch.zeros(0), turns=turns, retokenized=retokenized)
    deltas: list[torch.Tensor] = []
    for start in range(0, len(rows), 8):
        chunk = rows[start : start + 8]
        width = max(len(r) for r in chunk)
        ids = torch.full((len(chunk), width), pad_id, dtype=torch.long)
        attention = torch.zeros((len(chunk), width), dtype=torch.long)
        for i, row in enumerate(chunk):
            ids[i, : len(row)] = torch.tensor(row)
            attention[i, : len(row)] = 1
        logits = model(input_ids=ids, attention_mask=attention).logits.float()
        logp = torch.log_softmax(logits, dim=-1)
        for i, (offset, paired, engine) in enumerate(spans[start : start + 8]):
            positions = torch.arange(offset - 1, offset - 1 + paired)
            targets = ids[i, offset : offset + paired]
            trainer = logp[i, positions, targets]
            deltas.append(trainer - torch.tensor(engine, dtype=torch.float32))
    return _summarise(torch.cat(deltas), turns=turns, retokenized=retokenized)

"""prorl_server.training: results as tensors, the policy loss over model tokens only, the mismatch figures.

On a tiny randomly initialised Llama (transformers), so the arithmetic is checked exactly and fast; the
real model, engine and server are in tests/training/test_training_vllm.py.
"""

from __future__ import annotations

import math

import pytest
from repo_paths import DOCS

torch = pytest.importorskip("torch", reason="the trainer's side needs the train extra (torch)")
transformers = pytest.importorskip("transformers", reason="the trainer's side needs the train extra (transformers)")

from prorl_server.protocol import JobResult, JobStatus, Trajectory, TurnRecord  # noqa: E402
from prorl_server.training import (  # noqa: E402
    LossConfig,
    group_advantages,
    logprob_mismatch,
    policy_loss,
    reencoded_mismatch,
    token_batch,
    token_logprobs,
)

PAD = 0


def tiny_model(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    config = transformers.LlamaConfig(
        vocab_size=64,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=128,
    )
    return transformers.LlamaForCausalLM(config).eval()


def multiturn_result(job_id: str = "j", reward: float = 1.0) -> JobResult:
    """prompt [1 2 3]; model turn [10 11 12]; observation [20 21]; model turn [13 14]."""
    prompt = [1, 2, 3]
    first, observation, second = [10, 11, 12], [20, 21], [13, 14]
    response = first + observation + second
    mask = [1, 1, 1, 0, 0, 1, 1]
    logprobs = [-0.1, -0.2, -0.3, 0.0, 0.0, -0.4, -0.5]
    turns = [
        TurnRecord(backend="b", prompt_len=3, output_ids=first, logprobs=logprobs[:3], text="x", weight_version=0),
        TurnRecord(backend="b", prompt_len=8, output_ids=second, logprobs=logprobs[5:], text="y", weight_version=0),
    ]
    trajectory = Trajectory(
        prompt_ids=prompt, response_ids=response, response_mask=mask, response_logprobs=logprobs, turns=turns
    )
    return JobResult(job_id=job_id, status=JobStatus.COMPLETED, reward=reward, trajectory=trajectory)


def single_turn_result(job_id: str, response: list[int], reward: float) -> JobResult:
    logprobs = [-0.5] * len(response)
    trajectory = Trajectory(
        prompt_ids=[1, 2],
        response_ids=response,
        response_mask=[1] * len(response),
        response_logprobs=logprobs,
        turns=[TurnRecord(backend="b", prompt_len=2, output_ids=response, logprobs=logprobs, text="z")],
    )
    return JobResult(job_id=job_id, status=JobStatus.COMPLETED, reward=reward, trajectory=trajectory)


# batches ------------------------------------------------------------------------------------------


def test_the_loss_mask_covers_exactly_the_model_sampled_tokens_as_predicted_columns():
    batch = token_batch([multiturn_result()], [1.0], pad_id=PAD)
    assert batch.input_ids.tolist() == [[1, 2, 3, 10, 11, 12, 20, 21, 13, 14]]
    # column t predicts token t+1: tokens 10 11 12 (columns 2-4) and 13 14 (columns 7-8)
    assert batch.loss_mask.tolist() == [[0, 0, 1, 1, 1, 0, 0, 1, 1]]
    assert batch.rollout_logprobs[0].tolist() == pytest.approx([0, 0, -0.1, -0.2, -0.3, 0, 0, -0.4, -0.5])
    assert batch.model_tokens == 5


def test_rows_are_right_padded_and_padding_never_counts():
    short = single_turn_result("a", [5, 6], 1.0)
    long = single_turn_result("b", [5, 6, 7, 8, 9], 0.0)
    batch = token_batch([short, long], [0.5, -0.5], pad_id=PAD)
    assert batch.input_ids[0].tolist() == [1, 2, 5, 6, PAD, PAD, PAD]
    assert batch.attention_mask.tolist() == [[1, 1, 1, 1, 0, 0, 0], [1] * 7]
    assert batch.loss_mask.tolist() == [[0, 1, 1, 0, 0, 0], [0, 1, 1, 1, 1, 1]]
    micro = batch.select(slice(0, 1))
    assert micro.input_ids.shape == (1, 4) and micro.loss_mask.shape == (1, 3)


def test_bad_results_are_refused_with_the_job_named():
    empty = JobResult(job_id="e", status=JobStatus.FAILED)
    with pytest.raises(ValueError, match="result e has no prompt or response ids"):
        token_batch([empty], [0.0], pad_id=PAD)
    broken = multiturn_result("x")
    broken.trajectory.response_mask.pop()
    with pytest.raises(ValueError, match="result x: response ids, mask and logprobs differ"):
        token_batch([broken], [0.0], pad_id=PAD)
    with pytest.raises(ValueError, match="1 results but 2 advantages"):
        token_batch([multiturn_result()], [0.0, 1.0], pad_id=PAD)


def test_group_advantages_are_centred_and_scaled_and_zero_for_a_flat_group():
    assert group_advantages([1.0, 0.0, 0.0, 1.0]) == pytest.approx([1.0, -1.0, -1.0, 1.0], abs=1e-5)
    assert group_advantages([1.0, 0.0], scale=False) == [0.5, -0.5]
    assert group_advantages([1.0, 1.0, 1.0]) == [0.0, 0.0, 0.0]
    assert group_advantages([]) == []


# the loss -------------------------------------------------------------------------------------------


def test_observation_tokens_never_enter_the_loss():
    """Gradients reach only the model-sampled columns, and nothing about observation tokens as targets (their
    logprobs on either side) changes the loss."""
    model = tiny_model()
    batch = token_batch([multiturn_result()], [1.0], pad_id=PAD)
    logprobs = token_logprobs(model, batch).detach().requires_grad_(True)
    loss, stats = policy_loss(logprobs, batch, LossConfig(), tokens_in_batch=batch.model_tokens)
    loss.backward()
    grad = logprobs.grad[0].tolist()
    for column, covered in enumerate(batch.loss_mask[0].tolist()):
        assert (grad[column] != 0.0) == bool(covered), (column, grad)
    assert stats.tokens == 5

    garbled = logprobs.detach().clone()
    garbled[0, 5:7] = -50.0  # the observation columns: whatever the trainer computes there
    batch.rollout_logprobs[0, 5:7] = 7.0  # and whatever the rollout said
    again, _ = policy_loss(garbled, batch, LossConfig(), tokens_in_batch=batch.model_tokens)
    assert again.item() == pytest.approx(loss.item())


def test_at_ratio_one_both_losses_are_the_policy_gradient():
    model = tiny_model()
    batch = token_batch([multiturn_result()], [2.0], pad_id=PAD)
    with torch.no_grad():
        batch.rollout_logprobs.copy_(token_logprobs(model, batch) * batch.loss_mask)
    for mode in ("clip", "tis"):
        logprobs = token_logprobs(model, batch).detach().requires_grad_(True)
        loss, stats = policy_loss(logprobs, batch, LossConfig(mode=mode), tokens_in_batch=5)
        loss.backward()
        expected = (-2.0 / 5) * batch.loss_mask[0]
        assert logprobs.grad[0].tolist() == pytest.approx(expected.tolist(), abs=1e-6), mode
        assert stats.mean_ratio == pytest.approx(1.0, abs=1e-6) and stats.clip_fraction == 0.0


def test_the_clip_stops_the_gradient_of_a_token_pushed_past_the_bound():
    batch = token_batch([single_turn_result("a", [5, 6], 1.0)], [1.0], pad_id=PAD)
    logprobs = torch.zeros_like(batch.rollout_logprobs)
    logprobs[0, 1] = batch.rollout_logprobs[0, 1] + math.log(2.0)  # ratio 2 on the first token
    logprobs[0, 2] = batch.rollout_logprobs[0, 2]  # ratio 1 on the second
    logprobs.requires_grad_(True)
    loss, stats = policy_loss(logprobs, batch, LossConfig(mode="clip"), tokens_in_batch=2)
    loss.backward()
    assert logprobs.grad[0, 1].item() == 0.0 and logprobs.grad[0, 2].item() == pytest.approx(-0.5)
    assert stats.clip_fraction == 0.5

    tis = logprobs.detach().clone().requires_grad_(True)
    tis_loss, tis_stats = policy_loss(tis, batch, LossConfig(mode="tis", tis_cap=1.5), tokens_in_batch=2)
    tis_loss.backward()
    assert tis.grad[0, 1].item() == pytest.approx(-1.5 / 2) and tis_stats.clip_fraction == 0.5


def test_a_bad_loss_config_is_refused():
    with pytest.raises(ValueError, match="'clip' or 'tis'"):
        LossConfig(mode="ppo")
    with pytest.raises(ValueError, match="clip_low"):
        LossConfig(clip_low=1.5)


def test_micro_batches_add_up_to_the_whole_batch():
    model = tiny_model()
    results = [single_turn_result(str(i), [5, 6, 7][: 1 + i % 3], float(i % 2)) for i in range(6)]
    batch = token_batch(results, group_advantages([r.reward for r in results]), pad_id=PAD)
    whole, _ = policy_loss(token_logprobs(model, batch), batch, LossConfig(), tokens_in_batch=batch.model_tokens)
    parts = 0.0
    for start in range(0, 6, 4):
        part = batch.select(slice(start, start + 4))
        loss, _ = policy_loss(token_logprobs(model, part), part, LossConfig(), tokens_in_batch=batch.model_tokens)
        parts += loss.item()
    assert parts == pytest.approx(whole.item(), abs=1e-6)


def test_logits_are_computed_only_from_the_first_loss_column_and_agree_with_the_full_head():
    model = tiny_model()
    batch = token_batch([multiturn_result(), single_turn_result("s", [5, 6, 7], 0.0)], [1.0, -1.0], pad_id=PAD)
    kept = token_logprobs(model, batch)
    with torch.no_grad():
        logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits[:, :-1]
        full = torch.log_softmax(logits, -1).gather(-1, batch.input_ids[:, 1:, None]).squeeze(-1)
    covered = batch.loss_mask > 0
    assert torch.allclose(kept[covered], full[covered], atol=1e-5)


# mismatch ---------------------------------------------------------------------------------------------


def test_the_mismatch_is_zero_on_equal_logprobs_and_counts_tokens_outside_the_band():
    batch = token_batch([single_turn_result("a", [5, 6, 7, 8], 1.0)], [1.0], pad_id=PAD)
    same = logprob_mismatch(batch.rollout_logprobs.clone(), batch)
    assert (same.tokens, same.mean_abs, same.max_abs, same.out_of_band) == (4, 0.0, 0.0, 0.0)
    shifted = batch.rollout_logprobs.clone()
    shifted[0, 1] += 0.5  # ratio e^0.5 = 1.65, out of [0.8, 1.25]
    shifted[0, 2] -= 0.1  # ratio 0.90, inside
    figures = logprob_mismatch(shifted, batch)
    assert figures.mean_abs == pytest.approx(0.15) and figures.max_abs == pytest.approx(0.5)
    assert figures.out_of_band == 0.25


def test_reencoding_counts_retokenized_turns_and_pairs_logprobs_by_position():
    model = tiny_model()
    result = multiturn_result()
    with torch.no_grad():
        batch = token_batch([result], [0.0], pad_id=PAD)
        trainer = token_logprobs(model, batch)[0]
    # make the engine's logprobs the trainer's own, so the returned ids show no mismatch at all
    result.trajectory.turns[0].logprobs = trainer[2:5].tolist()
    result.trajectory.turns[1].logprobs = trainer[7:9].tolist()
    own = {"x": [10, 11, 12], "y": [13, 14]}
    same = reencoded_mismatch(model, own.__getitem__, [result], stop_ids=[], pad_id=PAD)
    assert (same.turns, same.turns_retokenized) == (2, 0)
    assert same.tokens == 5 and same.max_abs < 1e-5

    other = {"x": [10, 30, 31, 12], "y": [13, 14]}  # the tokenizer would split the first turn differently
    changed = reencoded_mismatch(model, other.__getitem__, [result], stop_ids=[], pad_id=PAD)
    assert (changed.turns, changed.turns_retokenized) == (2, 1)
    assert changed.tokens == 5 and changed.max_abs > 1e-3


def test_the_server_never_imports_the_trainers_side():
    """A server process (the app, every handler, the CLI) loads neither torch nor transformers nor TRL, even
    where the train extra is installed; only `prorl_server.training` does."""
    import subprocess
    import sys

    probe = (
        "import sys, prorl_server.cli, prorl_server.api.app, prorl_server.client, prorl_handlers.short_answer, "
        "prorl_handlers.math, prorl_handlers.swe, prorl_handlers.code;"
        "print(sorted(m for m in ('torch', 'transformers', 'trl', 'vllm') if m in sys.modules))"
    )
    loaded = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True)
    assert loaded.stdout.strip() == "[]", loaded.stdout + loaded.stderr
    trainer = subprocess.run(
        [sys.executable, "-c", "import sys, prorl_server.training; print('torch' in sys.modules)"],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert trainer.stdout.strip() == "True"


def test_the_trainers_guide_snippets_import_names_that_exist():
    """docs/trainers.md's training and TRL snippets: valid Python whose imports all resolve (the snippets
    themselves need a running server; tests/training/test_training_vllm.py runs the same calls)."""
    import ast
    import re

    guide = DOCS / "trainers.md"
    blocks = re.findall(r"```python\n(.*?)```", guide.read_text(), re.DOTALL)
    assert len(blocks) >= 3
    imported = 0
    for block in blocks:
        tree = ast.parse(block)
        imports = [node for node in tree.body if isinstance(node, ast.Import | ast.ImportFrom)]
        exec(compile(ast.Module(body=imports, type_ignores=[]), str(guide), "exec"), {})
        imported += len(imports)
    assert imported >= 8

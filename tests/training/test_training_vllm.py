"""A model trained through prorl-server with the real vLLM (CPU build) reloading its weights each step.

- `examples/train_grpo.py` for two steps, as a user runs it (its own vLLM and server as child processes):
  after the first update the engine's logprobs on a fixed probe differ from before (the weights really
  changed in vLLM), the second step's turns carry the new version, the loss is finite.
- TRL's `GRPOTrainer` with `ProrlRollout` as its rollout source, two steps against an in-process server and
  the real vLLM: the second step samples from the weights the first one pushed.

The full learning run is `benchmarks/bench_learning.py`, not a test. Skips where vLLM is not set up or the
train extra (torch, transformers, TRL) is missing; with PRORL_REQUIRE_VLLM=1 a missing vLLM fails instead.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest
from repo_paths import EXAMPLES

pytest.importorskip("torch", reason="the trainer's side needs the train extra (torch)")
pytest.importorskip("transformers", reason="the trainer's side needs the train extra (transformers)")

from prorl_handlers.short_answer import ShortAnswerHandler, learning_tasks

pytest_plugins = ("vllm_reload_fixtures",)
EXAMPLE = EXAMPLES / "train_grpo.py"


def test_two_training_steps_change_the_engines_weights_and_the_next_turns_version(vllm, tmp_path, monkeypatch):
    """(`vllm` only gates on the engine being set up; the example starts its own.)"""
    history = tmp_path / "history.json"
    argv = [sys.executable, str(EXAMPLE), "--steps", "2", "--groups", "2", "--group-size", "4"]
    argv += [
        "--eval-every",
        "2",
        "--eval-samples",
        "2",
        "--held-out-words",
        "6",
        "--lr",
        "1e-5",
        "--json",
        str(history),
    ]
    mlruns, wandb_runs = (tmp_path / "mlruns").as_uri(), tmp_path / "wandb-runs"
    argv += ["--mlflow-uri", mlruns, "--wandb-offline", str(wandb_runs), "--run-name", "two-steps"]
    # a directory store (mlflow-skinny has no sqlalchemy), for the example and for the client below that reads it
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    done = subprocess.run(argv, capture_output=True, text=True, timeout=600, env=env)
    out = done.stdout
    assert done.returncode == 0, out[-3000:] + done.stderr[-3000:]
    assert "train_r" in out and "held_r" in out and "rollout_s" in out and "sync_s" in out
    assert "stopping 2 child process(es)" in out and "learning curve" not in out

    record = json.loads(history.read_text())
    steps = record["steps"]
    assert [s["step"] for s in steps] == [0, 1] and [s["version"] for s in steps] == [1, 2]
    # the weights really changed in vLLM: its logprobs of a fixed text moved after each reload
    probes = [record["probe_logprob_initial"], steps[0]["probe_logprob"], steps[1]["probe_logprob"]]
    assert probes[0] != probes[1] != probes[2], probes
    # the second step's turns were sampled under the version the first step pushed
    assert 1 in steps[1]["sampled_versions"] and steps[0]["sampled_versions"] == [0]
    for step in steps:
        assert math.isfinite(step["loss"]) and math.isfinite(step["kl"]) and step["masked_tokens"] > 0
        assert 0 < step["masked_tokens"] < step["tokens"]  # prompt and observation tokens are left out
        assert step["sync_s"] > 0 and step["save_s"] > 0
    # at step 0 the same weights on both sides: the trainer's logprobs of the returned ids are vLLM's
    returned = record["mismatch_step0"]["returned_ids"]
    assert returned["tokens"] > 0 and returned["mean_abs"] < 1e-3 and returned["out_of_band"] == 0.0
    assert record["held_out_initial"].keys() == steps[1]["held_out"].keys() == {"greedy", "mean", "pass_at_k"}

    # the run as the trackers hold it: the config, each step's figures at its step, the summary
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=mlruns)
    (run,) = client.search_runs([client.get_experiment_by_name("prorl-train-grpo").experiment_id])
    assert run.info.run_name == "two-steps" and run.data.params["steps"] == "2" and run.data.params["lr"] == "1e-05"
    losses = client.get_metric_history(run.info.run_id, "loss")
    assert [(m.step, m.value) for m in losses] == [(s["step"], s["loss"]) for s in steps]
    assert [m.step for m in client.get_metric_history(run.info.run_id, "held_out/mean")] == [1]
    assert {a.path for a in client.list_artifacts(run.info.run_id)} == {"summary.txt", "history.json"}
    (wandb_run,) = (wandb_runs / "wandb").glob("offline-run-*")
    assert (wandb_run / "files" / "summary.txt").read_text().startswith("held-out mean reward")
    assert f"W&B offline run {wandb_run.name.rsplit('-', 1)[1]} in {wandb_runs}" in out


def test_trls_grpo_trainer_trains_on_prorl_server_rollouts(start_server, vllm, tmp_path):
    from datasets import Dataset  # noqa: F401  (TRL's dataset type; part of the train extra)
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    from prorl_server.client import SyncRolloutClient
    from prorl_server.training import CheckpointSync
    from prorl_server.training.trl_rollout import ProrlRollout, server_reward

    server = start_server([vllm.address], handlers={"short_answer": ShortAnswerHandler()})
    assert server.http.post("/weights/swap", json={"version": 5}).status_code == 200  # a server that ran before
    tokenizer = AutoTokenizer.from_pretrained(vllm.model_dir)
    model = AutoModelForCausalLM.from_pretrained(vllm.model_dir)
    config = GRPOConfig(
        output_dir=str(tmp_path / "trl"),
        use_cpu=True,
        max_steps=2,
        per_device_train_batch_size=4,
        num_generations=4,
        learning_rate=1e-5,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        max_completion_length=12,
        seed=0,
    )
    seen: list[list] = []
    with SyncRolloutClient(server.url, trust_env=False) as client:
        rollout = ProrlRollout(
            client,
            learning_tasks("train")[:8],
            prompt_of=lambda instance: instance["question"],
            sampling_params={"temperature": 1.0, "max_tokens": 12},
            agent_config={"max_turns": 2},
            weight_sync=CheckpointSync(client, tmp_path / "ckpt"),
        )
        run_groups = rollout.rollouts

        def recording(prompts):
            results = run_groups(prompts)
            seen.append(results)
            return results

        rollout.rollouts = recording
        trainer = GRPOTrainer(
            model=model,
            reward_funcs=server_reward,
            args=config,
            train_dataset=rollout.dataset(),
            processing_class=tokenizer,
            rollout_func=rollout,
        )
        trainer.train()
        versions = client.weights.status()

    assert trainer.state.global_step == 2
    assert rollout.first_version == 5 and len(rollout.pushes) == 1  # pushed once, before the second step
    assert [v.version for v in versions.values()] == [6]
    assert len(seen) == 2 and all(len(results) == 4 for results in seen)
    assert {v for r in seen[0] for v in r.trajectory.weight_versions} == {5}
    assert {v for r in seen[1] for v in r.trajectory.weight_versions} == {6}
    assert len({r.trajectory.prompt_ids[-8:].__repr__() for r in seen[0]}) == 1  # one group: one prompt
    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    assert len(losses) == 2 and all(math.isfinite(loss) for loss in losses)


def test_after_a_reload_vllm_computes_with_exactly_the_trainers_weights(start_server, vllm, tmp_path):
    """Every weight of the new checkpoint is what vLLM computes with after the reload, the output head tied to
    the input embeddings included (vLLM's CPU build kept the head's old packed weights until our engine
    plugin, src/prorl_server/vllm_cpu/engine_plugin/, prepared it again)."""
    import httpx
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    vllm.restore()  # the starting weights: an earlier test of the module pushed trained ones
    tokenizer = AutoTokenizer.from_pretrained(vllm.model_dir)
    model = AutoModelForCausalLM.from_pretrained(vllm.model_dir, dtype=torch.float32).eval()
    assert model.lm_head.weight is model.model.embed_tokens.weight  # the tied head this is about
    ids = tokenizer.encode("The quick brown fox jumps over the lazy dog, and then it runs back home to sleep.")

    def engine_logprobs() -> torch.Tensor:
        body = {"prompt": ids, "max_tokens": 1, "temperature": 0.0, "prompt_logprobs": 0}
        answer = httpx.post(f"{vllm.url}/v1/completions", json=body, timeout=120, trust_env=False).json()
        entries = answer["choices"][0]["prompt_logprobs"][1:]
        return torch.tensor([entry[str(token)]["logprob"] for entry, token in zip(entries, ids[1:], strict=True)])

    def trainer_logprobs() -> torch.Tensor:
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([ids])).logits[0, :-1]
        return torch.log_softmax(logits, -1).gather(-1, torch.tensor(ids[1:])[:, None]).squeeze(-1)

    before = engine_logprobs()
    assert (before - trainer_logprobs()).abs().max() < 1e-3
    torch.manual_seed(0)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            scale = 0.05 if "embed_tokens" in name else 0.01
            parameter.add_(torch.randn_like(parameter) * scale * parameter.abs().mean())
    model.save_pretrained(tmp_path / "perturbed", safe_serialization=True)
    server = start_server([vllm.address])
    swapped = server.http.post("/weights/swap", json={"version": 1, "reload": {"path": str(tmp_path / "perturbed")}})
    assert swapped.status_code == 200, swapped.text
    try:
        after = engine_logprobs()
        assert (after - before).abs().max() > 0.05  # the engine's weights moved
        assert (after - trainer_logprobs()).abs().max() < 1e-3  # to exactly the trainer's
    finally:  # the module's engine goes back to the weights it started with
        restored = server.http.post("/weights/swap", json={"version": 2, "reload": {"path": vllm.model_dir}})
        assert restored.status_code == 200, restored.text

"""CheckpointSync and ProrlRollout against a real prorl-server and the scripted backend (a test double that
records the engine calls a reload makes); the real vLLM runs them in tests/training/test_training_vllm.py."""

from __future__ import annotations

import pytest

pytest.importorskip("torch", reason="the trainer's side needs the train extra (torch)")
transformers = pytest.importorskip("transformers", reason="the trainer's side needs the train extra")

from prorl_server.client import SyncRolloutClient  # noqa: E402
from prorl_server.training import CheckpointSync  # noqa: E402
from prorl_server.training.trl_rollout import ProrlRollout, prompt_key, server_reward  # noqa: E402
from prorl_server.training.weights import WeightSyncError  # noqa: E402


def tiny_model():
    config = transformers.LlamaConfig(
        vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2
    )
    return transformers.LlamaForCausalLM(config)


def test_push_saves_a_checkpoint_the_engines_reload_and_keeps_only_the_last_two(start_server, backend, tmp_path):
    server = start_server([backend.address])
    with SyncRolloutClient(server.url, trust_env=False) as client:
        sync = CheckpointSync(client, tmp_path)
        timings = [sync.push(tiny_model(), version) for version in (1, 2, 3)]
        status = client.weights.status()[server.url]
    assert [t.version for t in timings] == [1, 2, 3] and all(t.save_s > 0 and t.reload_s > 0 for t in timings)
    assert (tmp_path / "v3" / "model.safetensors").exists() and (tmp_path / "v3" / "config.json").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["v2", "v3"]  # the previous one stays for a rollback
    assert backend.double.admin_log[-2:] == [f"reload_weights {tmp_path / 'v3'}", "reset_prefix_cache"]
    assert status.version == 3 and not status.paused


def test_a_checkpoint_the_engines_refuse_is_a_clear_error_and_rollouts_go_on(start_server, backend, tmp_path):
    server = start_server([backend.address])
    backend.double.bad_weight_paths.add(str(tmp_path / "v2"))
    with SyncRolloutClient(server.url, trust_env=False) as client:
        sync = CheckpointSync(client, tmp_path)
        sync.push(tiny_model(), 1)
        with pytest.raises(
            WeightSyncError,
            match=r"could not load the checkpoint .*v2 as version 2; rollouts go on .*Cannot find any model weights",
        ):
            sync.push(tiny_model(), 2)
        status = client.weights.status()[server.url]
    assert status.version == 1 and not status.paused  # rolled back to v1 and dispatching again
    assert backend.double.weights_path == str(tmp_path / "v1")


def test_the_rollout_runs_each_run_of_equal_prompts_as_one_group(server, backend):
    """TRL's prompts come `num_generations` times in a row; each run is one group, results in order."""
    instances = [{"data_source": "multiturn", "question": q} for q in ("one?", "two?")]
    for _ in range(6):
        backend.double.push("DONE")
    with SyncRolloutClient(server.url, trust_env=False) as client:
        rollout = ProrlRollout(client, instances, prompt_of=lambda i: i["question"], agent_config={"max_turns": 1})
        prompts = [row["prompt"] for row in rollout.dataset()]
        assert [p[0]["content"] for p in prompts] == ["one?", "two?"]

        class Trainer:  # the two attributes of TRL's GRPOTrainer the rollout reads without a weight sync
            class state:
                global_step = 0

        out = rollout([prompts[0]] * 4 + [prompts[1]] * 2, Trainer())
    assert len(backend.double.requests) == 6
    assert set(out) == {"prompt_ids", "completion_ids", "logprobs", "env_mask", "prorl_reward"}
    assert len(out["completion_ids"]) == 6
    for ids, logprobs, mask in zip(out["completion_ids"], out["logprobs"], out["env_mask"], strict=True):
        assert len(ids) == len(logprobs) == len(mask) > 0 and mask[0] == 1
    assert server_reward([], [], prorl_reward=out["prorl_reward"]) == out["prorl_reward"]
    with pytest.raises(KeyError, match="no instance for the prompt"):
        rollout.rollouts([[{"role": "user", "content": "three?"}]])
    assert prompt_key("text") == "text"


def test_two_instances_with_one_prompt_are_refused(server):
    twins = [{"data_source": "multiturn", "question": "same", "id": i} for i in range(2)]
    with SyncRolloutClient(server.url, trust_env=False) as client, pytest.raises(ValueError, match="same prompt"):
        ProrlRollout(client, twins, prompt_of=lambda i: i["question"])

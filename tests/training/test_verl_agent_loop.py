"""prorl-server's verl agent loop (src/prorl_server/training/verl_agent_loop.py), run in verl's environment.

The server (a real prorl-server over a scripted backend) runs in this process; the verl side runs in the venv
of scripts/setup-verl.sh as a subprocess (tests/training/verl_driver.py): verl's hydra instantiation of the
registered loop, its AgentLoopOutput, and AgentLoopWorker's own padding into a DataProto. Where that venv is
missing the test skips, saying so; with PRORL_REQUIRE_VERL=1 (scripts/test.sh) it fails instead. The actor
update (a GPU's) is not run.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from repo_paths import REPO, TESTS

from prorl_server.protocol import JobResult

REQUIRE_VERL_ENV = "PRORL_REQUIRE_VERL"
VERL_HOME = Path(
    os.environ.get("PRORL_VERL_HOME")
    or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "prorl-server" / "verl"
)
VERL_PYTHON = VERL_HOME / "venv" / "bin" / "python"
DRIVER = TESTS / "training" / "verl_driver.py"
PROMPT_LENGTH, RESPONSE_LENGTH = 64, 256


@pytest.fixture
def verl_python() -> Path:
    if not list((VERL_HOME / "venv").glob(".prorl-installed-verl-*")) or not VERL_PYTHON.exists():
        problem = f"verl is not installed in {VERL_HOME / 'venv'} (bash scripts/setup-verl.sh)"
        if os.environ.get(REQUIRE_VERL_ENV) == "1":
            pytest.fail(f"{REQUIRE_VERL_ENV}=1 but {problem}")
        pytest.skip(problem)
    return VERL_PYTHON


def run_driver(python: Path, spec: dict, tmp_path: Path) -> dict:
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    env = dict(os.environ, PYTHONPATH=str(REPO / "src"), RAY_DISABLE_IMPORT_WARNING="1")
    done = subprocess.run(
        [str(python), str(DRIVER), str(tmp_path / "spec.json"), str(tmp_path / "out.json")],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads((tmp_path / "out.json").read_text())


def sample(uid: str, instance: dict, index: int) -> dict:
    """A verl sample as RLHFDataset hands it to an agent loop (the fields the loop reads)."""
    return {
        "uid": uid,
        "index": index,
        "data_source": instance["data_source"],
        "raw_prompt": [{"role": "user", "content": "unused: the server's handler builds the prompt"}],
        "extra_info": {"instance": instance},
        "agent_name": "prorl_server",
    }


def test_the_verl_agent_loop_returns_the_servers_trajectories_padded_by_verl(
    verl_python, start_server, backend, tmp_path
):
    backend.double.push("thinking", "DONE", "DONE", "DONE", "DONE")  # then the default reply, "reply"
    server = start_server([backend.address])
    question = {"data_source": "multiturn", "question": "q"}
    samples = [
        sample("a", question, 0),
        sample("a", question, 0),
        sample("b", question, 1),
        sample("b", question, 1),
        sample("c", {"data_source": "raising", "fail_in": "run"}, 2),
    ]
    out = run_driver(
        verl_python,
        {
            "server_url": server.url,
            "prompt_length": PROMPT_LENGTH,
            "response_length": RESPONSE_LENGTH,
            "samples": samples,
            "unknown_sample": sample("d", {"data_source": "no_such_task"}, 3),
            "weight_version": 7,
        },
        tmp_path,
    )
    assert out["registered"] == "prorl_server.training.verl_agent_loop.ProrlServerAgentLoop"
    outputs, batch = out["outputs"], out["batch"]

    # one POST /groups per uid: members of a uid share a group id, two uids two groups
    groups = [o["extra_fields"]["prorl_group_id"] for o in outputs]
    assert groups[0] == groups[1] != groups[2] == groups[3] != groups[4]

    # each output is the server's own trajectory of its job
    for o in outputs:
        job_id = o["extra_fields"]["prorl_job_id"]
        result = JobResult.model_validate(server.http.get(f"/jobs/{job_id}").json()["result"])
        traj = result.trajectory
        assert o["prompt_ids"] == traj.prompt_ids and o["response_ids"] == traj.response_ids
        assert o["response_logprobs"] == traj.response_logprobs
        assert o["num_turns"] == len(traj.messages)
        assert o["extra_fields"]["prorl_weight_versions"] == traj.weight_versions
        assert o["extra_fields"]["prorl_status"] == result.status.value
        if result.status.value == "completed":
            assert o["response_mask"] == traj.response_mask
            assert o["reward_score"] == result.reward
        else:  # a failed job: kept, reward 0, nothing of it in the loss
            assert o["response_mask"] == [0] * len(traj.response_ids) and o["reward_score"] == 0.0
            assert "tool crashed" in o["extra_fields"]["prorl_error"]
    statuses = [o["extra_fields"]["prorl_status"] for o in outputs]
    assert statuses == ["completed"] * 4 + ["failed"]
    assert sorted(o["reward_score"] for o in outputs[:4]) == [0.0, 1.0, 1.0, 1.0]  # "thinking", "reply", ... vs DONE

    # verl's padding: prompts left-padded, responses right-padded, masks and logprobs aligned
    n = len(samples)
    assert out["len"] == n
    assert [len(batch["prompts"]), len(batch["prompts"][0])] == [n, PROMPT_LENGTH]
    assert [len(batch["responses"]), len(batch["responses"][0])] == [n, RESPONSE_LENGTH]
    for key in ("input_ids", "attention_mask", "position_ids"):
        assert [len(batch[key]), len(batch[key][0])] == [n, PROMPT_LENGTH + RESPONSE_LENGTH]
    for i, o in enumerate(outputs):
        p, r = len(o["prompt_ids"]), len(o["response_ids"])
        assert 0 < r <= RESPONSE_LENGTH
        assert batch["prompts"][i][PROMPT_LENGTH - p :] == o["prompt_ids"]
        assert batch["responses"][i][:r] == o["response_ids"]
        assert batch["response_mask"][i] == o["response_mask"] + [0] * (RESPONSE_LENGTH - r)
        assert batch["attention_mask"][i] == [0] * (PROMPT_LENGTH - p) + [1] * (p + r) + [0] * (RESPONSE_LENGTH - r)
        assert batch["rollout_log_probs"][i][:r] == pytest.approx(o["response_logprobs"], abs=1e-6)
        assert batch["rm_scores"][i] == [0.0] * (r - 1) + [o["reward_score"]] + [0.0] * (RESPONSE_LENGTH - r)
    assert out["non_tensor"]["__num_turns__"] == [o["num_turns"] for o in outputs]
    assert out["non_tensor"]["prorl_job_id"] == [o["extra_fields"]["prorl_job_id"] for o in outputs]

    # a data_source the server has no handler for: an error naming it
    assert out["unknown_error"]["type"] == "UnknownTaskSource"
    assert out["unknown_error"]["source"] == "no_such_task" and "no_such_task" in out["unknown_error"]["message"]

    # the weight-sync hook: paused around the push, then the new version, resumed
    assert out["weight_push"] == "verl update_weights"
    (status,) = out["weights_after"].values()
    assert status["version"] == 7 and not status["paused"]


def documented_setup() -> tuple[str, list[str]]:
    """docs/trainers.md's verl set-up: the agent loop YAML and the overrides of its `main_ppo` command."""
    text = (REPO / "docs" / "trainers.md").read_text()
    yaml = text.split("```yaml\n", 1)[1].split("```", 1)[0]
    command = text.split("```bash\n", 1)[1].split("```", 1)[0]
    overrides = [word for word in command.split() if "=" in word and word.startswith("actor_rollout_ref.")]
    return yaml, overrides


def test_the_documented_verl_config_runs_the_loop_through_verls_own_config(
    verl_python, start_server, backend, tmp_path
):
    """The YAML and the two overrides of docs/trainers.md, as written (only the server's address is this
    test's): verl's `ppo_trainer` config composed with the overrides, the YAML loaded into the registry as
    AgentLoopWorker does, and its default agent loop running a group of two samples."""
    yaml, overrides = documented_setup()
    assert "http://127.0.0.1:8000" in yaml and len(overrides) == 2
    server = start_server([backend.address])
    (tmp_path / "prorl_agent_loop.yaml").write_text(yaml.replace("http://127.0.0.1:8000", server.url))
    overrides = [o.replace("=prorl_agent_loop.yaml", f"={tmp_path / 'prorl_agent_loop.yaml'}") for o in overrides]
    question = {"data_source": "multiturn", "question": "q"}
    spec = {
        "server_url": None,
        "prompt_length": PROMPT_LENGTH,
        "response_length": RESPONSE_LENGTH,
        "samples": [sample("a", question, 0), sample("a", question, 0)],
        "overrides": overrides,
    }
    out = run_driver(verl_python, spec, tmp_path)
    assert out["loop"] == {
        "name": "prorl_server",
        "type": "ProrlServerAgentLoop",
        "server_url": server.url,
        "group_window_s": 0.05,
        "timeout_s": 3600.0,
        "fail_on_error": False,
    }
    outputs = out["outputs"]
    assert [o["extra_fields"]["prorl_status"] for o in outputs] == ["completed", "completed"]
    assert outputs[0]["extra_fields"]["prorl_group_id"] == outputs[1]["extra_fields"]["prorl_group_id"]
    assert out["len"] == 2

"""docs/trainers.md: its conversions of a result into verl's and NeMo RL's fields, run on real results."""

from __future__ import annotations

import re

from repo_paths import DOCS

from prorl_server.protocol import JobResult

GUIDE = DOCS / "trainers.md"


def conversions() -> dict:
    blocks = re.findall(r"```python\n(.*?)```", GUIDE.read_text(), re.DOTALL)
    (code,) = [block for block in blocks if "def to_verl(" in block]
    namespace: dict = {}
    exec(compile(code, str(GUIDE), "exec"), namespace)
    return namespace


def multiturn_result(server, backend) -> JobResult:
    backend.double.push("thinking", "still thinking", "DONE")
    body = {"instance": {"data_source": "multiturn", "question": "q"}, "sampling_params": {"max_turns": 3}}
    result = JobResult.model_validate(server.http.post("/process", json=body).json())
    assert result.status.value == "completed" and len(result.trajectory.turns) == 3
    return result


def test_the_verl_fields_are_the_trajectory(server, backend):
    result = multiturn_result(server, backend)
    verl = conversions()["to_verl"](result)
    assert len(verl["response_ids"]) == len(verl["response_mask"]) == len(verl["response_logprobs"])
    assert verl["prompt_ids"] + verl["response_ids"] == result.trajectory.prompt_ids + result.trajectory.response_ids
    assert verl["reward_score"] == result.reward == 1.0
    assert verl["num_turns"] == len(result.trajectory.messages) >= 6


def test_the_nemo_message_log_covers_the_stream_with_the_same_mask_and_logprobs(server, backend):
    result = multiturn_result(server, backend)
    traj = result.trajectory
    log = conversions()["to_nemo_message_log"](result)
    assert [t for m in log for t in m["token_ids"]] == traj.prompt_ids + traj.response_ids
    mask = [int(m["role"] == "assistant") for m in log for _ in m["token_ids"]]
    assert mask == [0] * len(traj.prompt_ids) + traj.response_mask
    logprobs = [lp for m in log if m["role"] == "assistant" for lp in m["generation_logprobs"]]
    assert logprobs == [lp for lp, m in zip(traj.response_logprobs, traj.response_mask, strict=True) if m]
    assert [m["role"] for m in log] == ["user", "assistant", "environment", "assistant", "environment", "assistant"]

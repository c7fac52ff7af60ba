"""A multi-turn job through HTTP, with exact token ids, logprobs and mask."""

from __future__ import annotations

from prorl_server.testing import ScriptedReply, ToyChatTokenizer

TOK = ToyChatTokenizer()


def test_multi_turn_job_returns_exact_tokens_logprobs_and_mask(server, backend):
    backend.double.push(
        ScriptedReply(text="thinking", logprobs=[-0.5] * 9),
        ScriptedReply(ids=[50, 51, 52], logprobs=[-1.0, -2.0, -3.0], finish_reason="length"),
        ScriptedReply(text="DONE", logprobs=[-0.25] * 5),
    )
    body = {
        "instance": {"data_source": "multiturn", "question": "2+2?"},
        "sampling_params": {"temperature": 0.7, "max_tokens": 64, "max_turns": 5},
    }
    result = server.http.post("/process", json=body).json()

    assert result["status"] == "completed", result
    assert result["reward"] == 1.0
    assert result["error"] is None
    traj = result["trajectory"]
    question = [{"role": "user", "content": "2+2?"}]
    assert traj["prompt_ids"] == TOK.encode(TOK.render(question, add_generation_prompt=True))

    thinking = [*TOK.encode("thinking"), TOK.eos_id]
    obs0 = TOK.encode("\n<|im_start|>user\nobservation 0<|im_end|>\n<|im_start|>assistant\n")
    # the length-cut turn lacks the end-of-turn marker: the template's closing is inserted as observation
    obs1 = TOK.encode("<|im_end|>\n<|im_start|>user\nobservation 1<|im_end|>\n<|im_start|>assistant\n")
    done = [*TOK.encode("DONE"), TOK.eos_id]
    assert traj["response_ids"] == thinking + obs0 + [50, 51, 52] + obs1 + done
    assert traj["response_mask"] == [1] * 9 + [0] * len(obs0) + [1] * 3 + [0] * len(obs1) + [1] * 5
    assert (
        traj["response_logprobs"]
        == [-0.5] * 9 + [0.0] * len(obs0) + [-1.0, -2.0, -3.0] + [0.0] * len(obs1) + [-0.25] * 5
    )

    turns = traj["turns"]
    assert [t["finish_reason"] for t in turns] == ["stop", "length", "stop"]
    assert turns[1]["output_ids"] == [50, 51, 52] and turns[1]["logprobs"] == [-1.0, -2.0, -3.0]
    assert all(t["backend"] == backend.address for t in turns)
    assert [m["role"] for m in traj["messages"]] == ["user", "assistant", "user", "assistant", "user", "assistant"]
    assert result["eval"] == {"turns": 3}
    assert set(result["timing"]) == {
        *("queue_s", "init_s", "run_s", "eval_s", "weight_pause_s", "total_s"),
        *("turns", "llm_s", "llm_queue_s", "tool_s"),
    }

    # what the backend saw: each prompt is exactly the previous context, sampling params passed through,
    # agent keys (max_turns) kept away from vLLM
    seen = backend.double.requests
    assert seen[0].prompt == traj["prompt_ids"]
    assert seen[1].prompt == traj["prompt_ids"] + thinking + obs0
    assert seen[2].prompt == traj["prompt_ids"] + thinking + obs0 + [50, 51, 52] + obs1
    assert seen[0].params["temperature"] == 0.7 and seen[0].params["max_tokens"] == 64
    assert seen[0].params["return_token_ids"] is True and seen[0].params["logprobs"] == 0
    assert "max_turns" not in seen[0].params


def test_full_stream_equals_template_of_whole_conversation(server, backend):
    backend.double.push("first", "DONE")
    body = {"instance": {"data_source": "multiturn", "question": "q"}, "sampling_params": {"max_turns": 3}}
    traj = server.http.post("/process", json=body).json()["trajectory"]
    full = TOK.encode(TOK.render(traj["messages"], add_generation_prompt=False))
    stream = traj["prompt_ids"] + traj["response_ids"]
    assert stream == full[: len(stream)]
    assert full[len(stream) :] == TOK.encode("\n")  # only the newline after the final <|im_end|>


def test_submit_then_poll(server, backend):
    backend.double.push("DONE")
    job_id = server.http.post(
        "/jobs", json={"instance": {"data_source": "multiturn", "question": "q"}, "job_id": "abc"}
    ).json()["job_id"]
    assert job_id == "abc"
    for _ in range(500):
        body = server.http.get(f"/jobs/{job_id}").json()
        if body["result"] is not None:
            break
        assert body["status"] in {"queued", "init", "run", "eval"}
        import time

        time.sleep(0.01)
    assert body["status"] == "completed" and body["result"]["reward"] == 1.0

"""The scripted backend (a test double) as handler tests use it: replies per job and per prompt, HTTP control
of its queues, an explicit error when nothing is queued, and scripted errors that do not spoil later jobs."""

from __future__ import annotations

from urllib.parse import quote

import httpx
import pytest
from server_jobs import result, submit

from prorl_server.testing import NoReplyQueued, ScriptedBackend, ScriptedReply


def turn_texts(res: dict) -> list[str]:
    return [t["text"] for t in res["trajectory"]["turns"]]


def circuit(server) -> dict:
    return server.http.get("/llm_servers").json()["servers"][0]


@pytest.fixture
def strict_server(start_server, strict):
    return start_server([strict.address])


def test_concurrent_jobs_each_get_the_replies_scripted_for_them(strict, strict_server):
    # "a" is slow on its first turn, so "b" overtakes it: a shared queue would hand out replies crosswise
    strict.double.push(ScriptedReply(text="a first", delay_s=0.4), "a DONE", job="a")
    strict.double.push("b first", "b DONE", job="b")
    submit(strict_server, "a")
    submit(strict_server, "b")
    res_a, res_b = result(strict_server, "a"), result(strict_server, "b")
    assert res_a["status"] == res_b["status"] == "completed", (res_a["error"], res_b["error"])
    assert turn_texts(res_a) == ["a first", "a DONE"]
    assert turn_texts(res_b) == ["b first", "b DONE"]
    seen = [(r.job_id, r.source) for r in strict.double.requests]
    assert sorted(seen) == [("a", "job 'a'")] * 2 + [("b", "job 'b'")] * 2


def test_job_ids_that_are_not_plain_ascii_reach_the_double_intact(strict, strict_server):
    job_id = "grüße: x\ty"
    strict.double.push("DONE", job=job_id)
    submit(strict_server, job_id)
    assert result(strict_server, quote(job_id, safe=""))["status"] == "completed"
    assert [r.job_id for r in strict.double.requests] == [job_id]


def test_replies_can_be_scripted_by_prompt_substring_or_regex(strict, strict_server):
    strict.double.push("Paris DONE", prompt="capital of France")
    strict.double.push("4 DONE", prompt_regex=r"\d\s*\+\s*\d")
    for job_id, question in [("f", "What is the capital of France?"), ("s", "What is 2 + 2?")]:
        submit(strict_server, job_id, instance={"data_source": "multiturn", "question": question})
    assert turn_texts(result(strict_server, "f")) == ["Paris DONE"]
    assert turn_texts(result(strict_server, "s")) == ["4 DONE"]
    sources = {r.job_id: r.source for r in strict.double.requests}
    assert sources == {"f": "prompt containing 'capital of France'", "s": r"prompt matching /\d\s*\+\s*\d/"}


def test_which_queue_answers_a_completion():
    double = ScriptedBackend()
    double.push("global 1", "global 2")
    double.push("job j", job="j")
    double.push("about cats", prompt="cat")
    assert double.take("j", "a cat") == (ScriptedReply(text="job j"), "job 'j'")  # the job's own script first
    assert double.take("other", "a cat") == (ScriptedReply(text="about cats"), "prompt containing 'cat'")
    assert double.take(None, "a dog") == (ScriptedReply(text="global 1"), "global queue")
    # a used-up job or prompt script does not take from the global queue: that would make tests order-dependent
    with pytest.raises(NoReplyQueued, match=r"no reply queued for job 'j'.*job 'j': all used up"):
        double.take("j", "a dog")
    with pytest.raises(NoReplyQueued, match=r"prompt containing 'cat': all used up"):
        double.take(None, "a cat")
    assert double.take(None, "a dog")[0].text == "global 2"
    with pytest.raises(NoReplyQueued, match=r"global queue: queue empty"):
        double.take(None, "a dog")
    double.default_reply = ScriptedReply(text="fallback")
    assert double.take("j", "a cat") == (ScriptedReply(text="fallback"), "default reply")
    with pytest.raises(ValueError, match="at most one"):
        double.push("x", job="j", prompt="p")


def test_the_script_is_pushed_inspected_and_reset_over_http(strict, strict_server):
    url = f"{strict.server.url}/script"
    assert httpx.post(url, json=["DONE", {"text": "slow", "delay_s": 0.1}]).json() == {"queued": 2}
    assert httpx.post(url, json={"job": "j", "replies": ["j DONE"]}).json() == {"queued": 1}
    assert httpx.post(url, json={"prompt": "France", "replies": [{"text": "Paris", "status_code": 200}]}).json() == {
        "queued": 1
    }
    assert httpx.post(url, json={"prompt_regex": "^x+$", "replies": ["x"]}).json() == {"queued": 1}
    for bad in (
        {"job": "j", "prompt": "p", "replies": ["x"]},  # two keys
        {"prompt_regex": "(", "replies": ["x"]},  # not a regex
        [{"txt": "typo"}],  # not a reply field
        [{"text": "x", "status_code": 99}],
        [{"text": "x", "status_code": 302}],
        {"replies": "DONE"},
    ):
        assert httpx.post(url, json=bad).status_code == 422, bad

    submit(strict_server, "j")
    assert turn_texts(result(strict_server, "j")) == ["j DONE"]
    shown = httpx.get(url).json()
    assert shown["global"] == [
        {"text": "DONE", "finish_reason": "stop", "status_code": 200},
        {"text": "slow", "finish_reason": "stop", "delay_s": 0.1, "status_code": 200},
    ]
    assert shown["jobs"] == {"j": []}
    assert [{k: v for k, v in p.items() if k != "replies"} for p in shown["prompts"]] == [
        {"prompt": "France"},
        {"prompt_regex": "^x+$"},
    ]
    assert [len(p["replies"]) for p in shown["prompts"]] == [1, 1] and shown["default_reply"] is None
    [seen] = shown["requests"]
    assert seen["job_id"] == "j" and seen["source"] == "job 'j'" and seen["outcome"] == "done"
    assert seen["prompt_text"].startswith("<|im_start|>user\nq<|im_end|>")
    assert httpx.get(f"{strict.server.url}/requests").json()[0]["job_id"] == "j"

    assert httpx.delete(url).json() == {"dropped": 4}
    assert httpx.get(url).json() == {"global": [], "jobs": {}, "prompts": [], "default_reply": None, "requests": []}


def test_string_replies_pushed_over_http_are_the_model_output(strict, strict_server):
    httpx.post(f"{strict.server.url}/script", json=["thinking", {"text": "DONE"}]).raise_for_status()
    submit(strict_server, "s")
    res = result(strict_server, "s")
    assert res["status"] == "completed" and turn_texts(res) == ["thinking", "DONE"]


def test_a_completion_nothing_is_queued_for_fails_the_job_naming_the_double(strict, strict_server):
    strict.double.push("first turn", job="j")
    submit(strict_server, "j")
    res = result(strict_server, "j")
    assert res["status"] == "failed" and res["error"]["type"] == "BackendRequestError", res["error"]
    message = res["error"]["message"]
    assert "HTTP 409" in message and "scripted backend: no reply queued for job 'j'" in message, message
    assert "observation 0" in message  # the end of the prompt it had nothing for
    assert [r.outcome for r in strict.double.requests] == ["done", "unscripted"]  # not retried
    info = circuit(strict_server)
    assert info["circuit"] == "closed" and info["consecutive_failures"] == 0


def test_a_default_reply_is_an_explicit_opt_in(start_backend, start_server):
    backend = start_backend(default_reply=ScriptedReply(text="fallback DONE"))
    server = start_server([backend.address])
    backend.double.push("scripted", job="j")
    submit(server, "j")
    assert turn_texts(result(server, "j")) == ["scripted", "fallback DONE"]
    assert [r.source for r in backend.double.requests] == ["job 'j'", "default reply"]


def test_a_scripted_500_is_retried_with_the_jobs_next_reply_and_spoils_no_later_job(strict, strict_server):
    strict.double.push(ScriptedReply(status_code=500), "DONE", job="a")
    strict.double.push("DONE", job="b")
    submit(strict_server, "a")
    assert result(strict_server, "a")["status"] == "completed"
    submit(strict_server, "b")
    assert result(strict_server, "b")["status"] == "completed"
    assert [(r.job_id, r.outcome) for r in strict.double.requests] == [("a", "done"), ("a", "done"), ("b", "done")]
    info = circuit(strict_server)
    assert info["circuit"] == "closed" and info["consecutive_failures"] == 0


def test_a_job_failed_by_scripted_500s_leaves_the_backend_usable_once_the_breaker_cools(strict, start_server):
    # 2 attempts per call, the breaker opens at the 2nd consecutive failure and tries again 0.2 s later
    server = start_server([strict.address], llm_max_failovers=1, llm_failure_threshold=2, llm_breaker_cooldown_s=0.2)
    strict.double.push(*[ScriptedReply(status_code=503)] * 2, job="a")
    strict.double.push("DONE", job="b")
    submit(server, "a")
    res_a = result(server, "a")
    assert res_a["status"] == "failed" and res_a["error"]["type"] == "BackendUnavailable"
    assert "scripted backend: scripted failure 503 (job 'a')" in res_a["error"]["message"]
    assert circuit(server)["circuit"] == "open"
    submit(server, "b")  # waits for the cooldown, then is the trial request
    assert result(server, "b")["status"] == "completed"
    assert circuit(server)["circuit"] == "closed"


def test_a_scripted_4xx_fails_the_job_at_once_without_counting_against_the_backend(strict, strict_server):
    strict.double.push(ScriptedReply(status_code=400), job="a")
    strict.double.push("DONE", job="b")
    submit(strict_server, "a")
    res_a = result(strict_server, "a")
    assert (
        res_a["status"] == "failed" and "HTTP 400: scripted backend: scripted failure 400" in res_a["error"]["message"]
    )
    assert circuit(strict_server)["consecutive_failures"] == 0
    submit(strict_server, "b")
    assert result(strict_server, "b")["status"] == "completed"
    assert len(strict.double.requests) == 2

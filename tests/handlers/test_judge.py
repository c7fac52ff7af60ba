"""LLM-judge rewards: `--judge-server`, `ctx.judge` in EVAL, the judged_answer handler, failures, and the
request shape the official OpenAI client sends (the scripted double plays the judge; the dev engine too)."""

from __future__ import annotations

import asyncio
import logging
import re
import subprocess
import sys
import time
from typing import Any

import openai
import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from openai.types.chat import ChatCompletion
from openai.types.chat.completion_create_params import CompletionCreateParamsNonStreaming
from prorl_handlers.judged_answer import JudgedAnswerHandler, load_questions
from pydantic import TypeAdapter
from repo_paths import DOCS

from prorl_server import AgentHandler, JobContext
from prorl_server.api.state import build_judge
from prorl_server.cli import build_parser, settings_from_args
from prorl_server.llm.judge import JUDGE_API_KEY_ENV, JudgeError, JudgePool, parse_verdict
from prorl_server.llm.retry import RetryPolicy
from prorl_server.testing import UvicornThread
from prorl_server.testing.scripted_backend import MODEL_NAME, ScriptedReply

pytest_plugins = ("devllm_fixtures",)

GUIDE = DOCS / "handlers.md"

ICE = {
    "data_source": "judged_answer",
    "id": "t-ice",
    "question": "Why does ice float?",
    "reference": "Ice is less dense than liquid water.",
}


class JudgeOnlyHandler(AgentHandler):
    """No policy call: EVAL asks the judge about the instance's `answer` (async)."""

    async def run(self, ctx: JobContext) -> None:
        ctx.artifacts["answer"] = ctx.instance.get("answer", "")

    async def eval(self, ctx: JobContext) -> dict[str, Any]:
        reply = await ctx.judge.ask(f"Grade: {ctx.artifacts['answer']}", max_tokens=32)
        return {"reward": 1.0 if parse_verdict(reply.text) == "correct" else 0.0, "judge_text": reply.text}


class SyncJudgeHandler(AgentHandler):
    """The same from plain `def` methods, through ctx.wait."""

    def run(self, ctx: JobContext) -> None:
        ctx.artifacts["answer"] = ctx.instance.get("answer", "")

    def eval(self, ctx: JobContext) -> float:
        reply = ctx.wait(ctx.judge.chat([{"role": "user", "content": "Grade it."}], max_tokens=32))
        return 1.0 if parse_verdict(reply.text) == "correct" else 0.0


class JudgeInRunHandler(AgentHandler):
    """Reaches for the judge in RUN, where it is refused."""

    async def run(self, ctx: JobContext) -> None:
        await ctx.judge.ask("may I?")

    async def eval(self, ctx: JobContext) -> float:
        return 1.0


HANDLERS = {
    "judged_answer": JudgedAnswerHandler(),
    "judge_only": JudgeOnlyHandler(),
    "sync_judge": SyncJudgeHandler(),
    "judge_in_run": JudgeInRunHandler(),
}


@pytest.fixture
def judge(start_backend):
    """A scripted double playing the judge: it answers only what a test queues."""
    return start_backend(default_reply=None)


def serve(start_server, policy, judges, **settings):
    return start_server([policy.address], handlers=HANDLERS, judge_servers=[j.address for j in judges], **settings)


def process(server, instance: dict, **sampling) -> dict:
    body = {"instance": instance, "sampling_params": {"max_tokens": 96, **sampling}, "timeout": 60}
    return server.http.post("/process", json=body).json()


def chat_requests(double) -> list:
    return [r for r in double.requests if r.messages is not None]


# --- the judged_answer handler --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("judge_says", "reward", "verdict"),
    [
        ("The answer gives the same reason.\nVERDICT: correct", 1.0, "correct"),
        ("It names the wrong cause.\n**Verdict:** Incorrect.", 0.0, "incorrect"),
    ],
)
def test_the_judges_verdict_is_the_reward(start_server, backend, judge, judge_says, reward, verdict):
    backend.double.push("Because ice is lighter than the same volume of water.")
    judge.double.push(judge_says)
    server = serve(start_server, backend, [judge])

    result = process(server, ICE)

    assert result["status"] == "completed", result["error"]
    assert result["reward"] == reward
    assert result["eval"]["verdict"] == verdict and result["eval"]["judge_model"] == MODEL_NAME
    assert result["eval"]["judge_usage"]["completion_tokens"] > 0
    (asked,) = chat_requests(judge.double)
    assert [m["role"] for m in asked.messages] == ["system", "user"]
    prompt = asked.messages[1]["content"]
    assert ICE["question"] in prompt and ICE["reference"] in prompt
    assert "lighter than the same volume of water" in prompt  # the policy's answer, as RUN stored it


def test_the_judges_tokens_never_enter_the_trajectory(start_server, backend, judge):
    backend.double.push("Ice is less dense.")
    judge.double.push("Same meaning. VERDICT: correct")
    server = serve(start_server, backend, [judge])

    traj = process(server, ICE)["trajectory"]

    assert [m["role"] for m in traj["messages"]] == ["user", "assistant"]
    assert len(traj["turns"]) == 1
    tok = backend.double.tokenizer
    assert tok.decode(traj["response_ids"]) == "Ice is less dense.<|im_end|>"
    assert "VERDICT" not in tok.decode(traj["prompt_ids"] + traj["response_ids"])
    assert [r.messages for r in backend.double.requests] == [None]  # the policy saw one completion, no chat
    assert len(judge.double.requests) == 1 and chat_requests(judge.double)  # the judge saw one chat, no completion


def test_a_judge_reply_without_a_verdict_scores_zero_and_says_so(start_server, backend, judge):
    judge.double.push("I am not sure what to make of this.")
    server = serve(start_server, backend, [judge])

    result = process(server, ICE)

    assert result["status"] == "completed" and result["reward"] == 0.0
    assert result["eval"]["verdict"] is None
    assert result["eval"]["judge_reply_tail"] == "I am not sure what to make of this."


def test_the_shipped_questions_are_valid_instances(start_server, backend, judge):
    questions = load_questions()
    assert len(questions) >= 5 and len({q["id"] for q in questions}) == len(questions)
    server = serve(start_server, backend, [judge])
    judge.double.push("VERDICT: correct")
    result = process(server, questions[0])
    assert result["status"] == "completed" and result["reward"] == 1.0, result["error"]
    bad = server.http.post("/process", json={"instance": {"data_source": "judged_answer", "question": "q"}})
    assert bad.status_code == 400 and "reference" in bad.text


@pytest.mark.parametrize(
    ("text", "verdict"),
    [
        ("VERDICT: correct", "correct"),
        ("verdict: INCORRECT.", "incorrect"),
        ("**VERDICT:** correct", "correct"),
        ("VERDICT: [incorrect]", "incorrect"),
        ('Verdict = "correct"', "correct"),
        ("Answer with VERDICT: correct or VERDICT: incorrect.\nVERDICT: incorrect", "incorrect"),
        ("The answer is correct.", None),  # no VERDICT line
        ("VERDICT: correctish", None),
        ("VERDICT: in-correct", None),
        ("", None),
    ],
)
def test_verdicts_are_read_robustly(text, verdict):
    assert parse_verdict(text) == verdict


# --- configuration and separation from the policy -------------------------------------------------------


def test_without_a_judge_server_the_job_fails_saying_how_to_configure_one(start_server, backend):
    server = start_server([backend.address], handlers=HANDLERS)

    result = process(server, ICE)

    assert result["status"] == "failed"
    error = result["error"]
    assert (error["stage"], error["type"]) == ("eval", "JudgeUnavailable")
    assert "--judge-server" in error["message"]


def test_the_judge_is_refused_outside_eval(start_server, backend, judge):
    server = serve(start_server, backend, [judge])

    result = process(server, {"data_source": "judge_in_run"})

    assert result["status"] == "failed"
    assert (result["error"]["stage"], result["error"]["type"]) == ("run", "JudgeUnavailable")
    assert "EVAL only" in result["error"]["message"]
    assert judge.double.requests == []


def test_the_judge_is_not_a_policy_backend_and_a_weight_update_leaves_it_alone(start_server, backend, judge):
    server = serve(start_server, backend, [judge])
    assert [s["address"] for s in server.http.get("/llm_servers").json()["servers"]] == [backend.address]
    assert server.http.get("/status").json()["llm_servers"] == 1

    assert server.http.post("/weights/pause", json={}).json()["drained"]
    update = server.http.post("/weights/update", json={"version": 7, "reload": {"path": "/ckpt/7"}})
    assert update.status_code == 200, update.text
    judge.double.push("VERDICT: correct")
    result = process(server, {"data_source": "judge_only", "answer": "x"})  # EVAL's judge call, while paused
    assert result["status"] == "completed" and result["reward"] == 1.0, result["error"]
    assert server.http.post("/weights/resume").status_code == 200

    assert backend.double.admin_log == ["reload_weights /ckpt/7", "reset_prefix_cache"]
    assert judge.double.admin_log == []
    assert [s["address"] for s in server.http.get("/llm_servers").json()["servers"]] == [backend.address]


def test_judge_flags_and_the_api_key_variable(monkeypatch):
    monkeypatch.delenv(JUDGE_API_KEY_ENV, raising=False)
    argv = ["serve", "--judge-server", "http://a/v1", "--judge-servers", "http://b/v1", "--judge-model", "m"]
    settings = settings_from_args(build_parser().parse_args([*argv, "--judge-timeout", "9"]))
    assert settings.judge_servers == ["http://a/v1", "http://b/v1"]
    assert (settings.judge_model, settings.judge_timeout_s) == ("m", 9.0)
    assert (settings.judge_max_concurrency, settings.judge_rate) == (32, None)
    limits = ["--judge-max-concurrency", "4", "--judge-rate", "2.5"]
    pool = build_judge(settings_from_args(build_parser().parse_args([*argv, *limits])))
    assert pool is not None and (pool.quota.limit, pool.quota.config.rate_per_s) == (4, 2.5)
    assert pool.quota.name == "judge"
    with pytest.raises(ValueError, match="max_concurrency must be at least 1"):
        JudgePool(["http://a/v1"], max_concurrency=0)


def test_a_judge_server_that_is_not_an_http_url_is_refused_at_start():
    with pytest.raises(ValueError, match="not an http"):
        JudgePool(["localhost:8001/v1"])
    argv = [sys.executable, "-m", "prorl_server.cli", "serve", "--port", "0", "--judge-server", "localhost:8001/v1"]
    run = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert run.returncode == 1 and "Traceback" not in run.stderr, run.stderr
    assert "prorl-server: judge server 'localhost:8001/v1' is not an http(s) URL" in run.stderr


# --- failures: retried, refused, malformed, oversized, hanging ------------------------------------------


def test_a_5xx_is_retried_on_the_next_judge_server(start_server, backend, start_backend, judge):
    second = start_backend(default_reply=None)
    judge.double.push(ScriptedReply(status_code=500))
    second.double.push("VERDICT: correct")
    server = serve(start_server, backend, [judge, second])

    result = process(server, {"data_source": "judge_only", "answer": "x"})

    assert result["status"] == "completed" and result["reward"] == 1.0, result["error"]
    assert len(chat_requests(judge.double)) == 1 and len(chat_requests(second.double)) == 1


def test_sync_handlers_reach_the_judge_through_ctx_wait(start_server, backend, judge):
    judge.double.push("VERDICT: correct")
    server = serve(start_server, backend, [judge])
    result = process(server, {"data_source": "sync_judge"})
    assert result["status"] == "completed" and result["reward"] == 1.0, result["error"]


def test_a_judge_failing_past_the_retry_budget_fails_the_job_with_its_status(start_server, backend, start_backend):
    failing = start_backend(default_reply=ScriptedReply(status_code=503))
    server = serve(start_server, backend, [failing], judge_retry_budget_s=0.5)

    started = time.monotonic()
    result = process(server, {"data_source": "judge_only", "answer": "x"})

    assert time.monotonic() - started < 10
    assert result["status"] == "failed" and result["error"]["type"] == "JudgeError"
    message = result["error"]["message"]
    assert "0.5s retry budget" in message and "HTTP 503" in message
    assert len(chat_requests(failing.double)) >= 2


# --- load: the judge's quota --------------------------------------------------------------------------------


QUICK_RETRIES = RetryPolicy(budget_s=30, base_delay_s=0.01, max_delay_s=0.05)


async def test_a_burst_of_429s_queues_the_calls_and_every_one_succeeds(judge):
    busy, fine = ScriptedReply(status_code=429, delay_s=0.2), ScriptedReply(text="VERDICT: correct", delay_s=0.2)
    judge.double.push(*[busy] * 4, *[fine] * 16)
    pool = JudgePool([judge.address], max_concurrency=4, retry=QUICK_RETRIES)
    limits: set[int] = set()

    async def watch() -> None:  # a success takes 0.2 s: a cut limit stays cut for that long at least
        while True:
            limits.add(pool.quota.limit)
            await asyncio.sleep(0.005)

    watcher = asyncio.create_task(watch())
    replies = await asyncio.gather(*(pool.ask(f"grade {i}", max_tokens=16) for i in range(16)))
    watcher.cancel()

    assert [r.text for r in replies] == ["VERDICT: correct"] * 16
    assert len(chat_requests(judge.double)) == 20  # each 429 retried once
    figures = pool.quota.snapshot()
    assert figures.overloads_total == 4 and figures.backoffs_total >= 1
    assert min(limits) <= 2  # the limit was cut (4 -> 2, once per wave) ...
    assert figures.limit == 4  # ... and grew back with the successes
    assert (figures.in_use, figures.waiting, figures.granted_total) == (0, 0, 20)
    assert judge.double.max_in_flight <= 4


def test_the_judges_quota_is_in_the_metrics(start_server, backend, judge):
    backend.double.push("Because ice is lighter than the same volume of water.")
    judge.double.push("VERDICT: correct")
    server = serve(start_server, backend, [judge], judge_max_concurrency=3)
    before = server.http.get("/metrics").text
    assert 'prorl_service_concurrency_limit{service="judge"} 3.0' in before
    assert 'prorl_service_granted_total{service="judge"} 0.0' in before

    assert process(server, ICE)["status"] == "completed"

    after = server.http.get("/metrics").text
    granted = [line for line in after.splitlines() if line.startswith('prorl_service_granted_total{service="judge"}')]
    assert granted and float(granted[0].split()[-1]) >= 1
    assert 'prorl_service_in_use{service="judge"} 0.0' in after
    assert 'prorl_service_overloads_total{service="judge"} 0.0' in after
    assert "prorl_service_" not in start_server([backend.address]).http.get("/metrics").text  # no judge, no series


async def test_a_judge_pool_limited_to_2_never_has_more_than_2_requests_at_the_judge(judge):
    judge.double.push(*[ScriptedReply(text="VERDICT: correct", delay_s=0.2)] * 8)
    pool = JudgePool([judge.address], model=MODEL_NAME, max_concurrency=2)

    replies = await asyncio.gather(*(pool.ask(f"grade {i}", max_tokens=16) for i in range(8)))

    assert len(replies) == 8 and judge.double.max_in_flight == 2
    assert pool.quota.snapshot().queue_wait_p95_s > 0  # the others queued


async def test_a_503_with_retry_after_holds_back_the_next_request_that_long(recording_judge):
    judge = recording_judge(chat_body("VERDICT: correct"), refuse={503: 1})  # then answers
    pool = JudgePool([judge.address], model="hosted", retry=QUICK_RETRIES)

    reply = await pool.ask("grade this")

    assert reply.text == "VERDICT: correct"
    first, second = judge.arrivals
    assert second - first > 1.0  # Retry-After: 1
    figures = pool.quota.snapshot()
    assert (figures.overloads_total, figures.limit) == (1, 16)


def test_a_4xx_fails_at_once_without_retry(start_server, backend, judge):
    judge.double.push(ScriptedReply(status_code=400))
    server = serve(start_server, backend, [judge])

    result = process(server, {"data_source": "judge_only", "answer": "x"})

    assert result["status"] == "failed" and result["error"]["type"] == "JudgeError"
    assert "rejected the request: HTTP 400" in result["error"]["message"]
    assert len(chat_requests(judge.double)) == 1


@pytest.mark.parametrize(
    ("fault", "says"),
    [
        ("not_json", "not a chat completion"),
        ("missing_field", "choices"),
        ("choice_not_object", "not a chat completion"),
        ("huge_body", "more than this request can need"),
        ("huge_content_length", "refused unread"),
    ],
)
def test_a_malformed_or_oversized_answer_fails_the_job_clearly(start_server, backend, judge, fault, says):
    judge.double.inject("completions", fault)
    judge.double.push("VERDICT: correct")
    server = serve(start_server, backend, [judge])

    started = time.monotonic()
    result = process(server, {"data_source": "judge_only", "answer": "x"})

    assert time.monotonic() - started < 10
    assert result["status"] == "failed" and result["error"]["type"] == "JudgeError", result["error"]
    assert "answered malformed data" in result["error"]["message"] and says in result["error"]["message"]


def test_a_hanging_judge_times_out(start_server, backend, judge):
    judge.double.inject("completions", "hang")
    judge.double.push("VERDICT: correct")
    server = serve(start_server, backend, [judge], judge_timeout_s=0.5, judge_retry_budget_s=0)

    started = time.monotonic()
    result = process(server, {"data_source": "judge_only", "answer": "x"})

    assert time.monotonic() - started < 10
    assert result["status"] == "failed" and result["error"]["type"] == "JudgeError"
    assert "stall timeout" in result["error"]["message"]
    figures = server.state.orchestrator.judge.quota.snapshot()
    assert (figures.overloads_total, figures.limit, figures.in_use) == (1, 16, 0)  # a stall is an overload


class RecordingJudge:
    """An OpenAI-style chat server that answers a fixed body and records each request's headers and arrival
    time; `refuse` {status: n}: the first n requests get that status, with `Retry-After: 1`."""

    def __init__(self, body: dict[str, Any], refuse: dict[int, int] | None = None) -> None:
        self.headers: list[dict[str, str]] = []
        self.arrivals: list[float] = []
        refusals = [status for status, n in (refuse or {}).items() for _ in range(n)]
        app = FastAPI()

        @app.post("/v1/chat/completions")
        async def chat(request: Request) -> Any:
            self.headers.append(dict(request.headers))
            self.arrivals.append(time.monotonic())
            if refusals:
                return JSONResponse({"error": {"message": "busy"}}, refusals.pop(0), {"retry-after": "1"})
            return body

        self.server = UvicornThread(app).start()
        self.address = f"{self.server.url}/v1"


def chat_body(content: Any) -> dict[str, Any]:
    message = {"role": "assistant", "content": content}
    return {"model": "hosted", "choices": [{"index": 0, "message": message, "finish_reason": "stop"}]}


@pytest.fixture
def recording_judge():
    started: list[RecordingJudge] = []

    def start(body: dict[str, Any], refuse: dict[int, int] | None = None) -> RecordingJudge:
        started.append(RecordingJudge(body, refuse))
        return started[-1]

    yield start
    for judge in started:
        judge.server.stop()


async def test_the_api_key_is_sent_as_a_bearer_token_and_never_shown(recording_judge, caplog):
    key = "sk-judge-secret"
    judge = recording_judge(chat_body("VERDICT: correct"))
    pool = JudgePool([judge.address], model="hosted", api_key=key)

    reply = await pool.ask("grade this")

    assert (reply.text, reply.model, reply.usage) == ("VERDICT: correct", "hosted", None)
    assert judge.headers[0]["authorization"] == f"Bearer {key}"
    assert key not in repr(pool)
    failing = JudgePool(["http://127.0.0.1:9/v1"], model="m", api_key=key, retry=RetryPolicy(budget_s=0.3))
    with caplog.at_level(logging.DEBUG), pytest.raises(JudgeError) as raised:
        await failing.ask("grade this")
    assert key not in str(raised.value) and key not in caplog.text


@pytest.mark.parametrize(("content", "says"), [(None, "no text content"), (42, "content")])
async def test_an_answer_whose_content_is_not_text_is_refused(recording_judge, content, says):
    judge = recording_judge(chat_body(content))
    with pytest.raises(JudgeError, match=says):
        await JudgePool([judge.address], model="hosted").ask("grade this")


async def test_a_server_listing_several_models_needs_judge_model():
    models = FastAPI()

    @models.get("/v1/models")
    async def listed() -> dict[str, Any]:
        return {"object": "list", "data": [{"id": "a"}, {"id": "b"}]}

    server = UvicornThread(models).start()
    try:
        with pytest.raises(JudgeError, match="lists 2 models; name the judge's with --judge-model"):
            await JudgePool([f"{server.url}/v1"]).ask("x")
    finally:
        server.stop()


async def test_bad_call_parameters_are_refused_before_any_request(judge):
    pool = JudgePool([judge.address])
    for params in ({"stream": True}, {"n": 2}, {"max_tokens": 0}, {"max_tokens": None}):
        with pytest.raises(ValueError):
            await pool.ask("x", **params)
    with pytest.raises(ValueError, match="messages"):
        await pool.chat([])
    assert judge.double.requests == []


# --- the request is what the official OpenAI client sends ----------------------------------------------


async def test_the_request_is_the_one_the_official_openai_client_sends(judge):
    messages = [{"role": "system", "content": "You grade."}, {"role": "user", "content": "Grade: 4"}]
    judge.double.push("VERDICT: correct", "VERDICT: correct")

    reply = await JudgePool([judge.address]).chat(messages, max_tokens=64)
    client = openai.AsyncOpenAI(base_url=judge.address, api_key="unused", max_retries=0)
    async with client:
        official = await client.chat.completions.create(
            model=MODEL_NAME, messages=messages, max_tokens=64, temperature=0.0
        )

    ours, theirs = chat_requests(judge.double)
    assert (ours.messages, ours.params) == (theirs.messages, theirs.params)
    TypeAdapter(CompletionCreateParamsNonStreaming).validate_python({**ours.params, "messages": ours.messages})
    assert isinstance(official, ChatCompletion)  # and the double's answer is one the client parses
    assert official.choices[0].message.content == reply.text == "VERDICT: correct"
    assert reply.usage is not None and reply.usage.completion_tokens == official.usage.completion_tokens


def test_the_guides_judge_example_runs(start_server, backend, judge):
    text = GUIDE.read_text()
    section = text[text.index("### LLM-judge rewards") :]
    namespace: dict = {}
    exec(compile(re.search(r"```python\n(.*?)```", section, re.DOTALL).group(1), str(GUIDE), "exec"), namespace)
    backend.double.push("Paris")
    judge.double.push("Same city. VERDICT: correct")
    handlers = {"capital": namespace["JudgedCapitalHandler"]()}
    server = start_server([backend.address], handlers=handlers, judge_servers=[judge.address])

    instance = {"data_source": "capital", "question": "Capital of France?", "reference": "Paris"}
    result = process(server, instance)

    assert result["status"] == "completed" and result["reward"] == 1.0, result["error"]
    assert result["eval"] == {"verdict": "correct"}
    assert "Answer: Paris" in chat_requests(judge.double)[0].messages[0]["content"]


# --- a real model as the judge --------------------------------------------------------------------------


def test_the_dev_engine_judges_a_job(start_server, backend, dev_llm):
    backend.double.push("Because ice is less dense than water.")
    before = len(dev_llm.generations())
    server = start_server([backend.address], handlers=HANDLERS, judge_servers=[dev_llm.address])

    result = process(server, ICE, judge_max_tokens=24)

    assert result["status"] == "completed", result["error"]
    details = result["eval"]
    assert details["verdict"] in ("correct", "incorrect", None)
    assert result["reward"] == (1.0 if details["verdict"] == "correct" else 0.0)
    assert details["judge_model"]  # the engine's own model name, from its /v1/models
    assert 1 <= details["judge_usage"]["completion_tokens"] <= 24
    assert len(dev_llm.generations()) == before + 1  # the judge's generation, on the engine
    assert [m["role"] for m in result["trajectory"]["messages"]] == ["user", "assistant"]

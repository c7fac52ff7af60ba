"""The simulated backend (prorl_server.simllm): vLLM's protocol with synthetic tokens and modelled timing."""

from __future__ import annotations

import asyncio
import re
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
from polling import wait_for

from prorl_server.cli import build_parser
from prorl_server.devllm.sampler import SamplingParams
from prorl_server.simllm import LatencyProfile, SimEngine, SimLLMServer, SimLLMSettings
from prorl_server.simllm.cli import settings_from_args
from prorl_server.simllm.prefix_cache import PrefixCache
from prorl_server.testing.uvicorn_thread import free_port

FAST = 1000.0  # time scale of tests that do not care about wall time
PREFILL = 1e-4  # the default prefill seconds per token
EOS = 2  # <|im_end|>
_METRIC = re.compile(r"^(vllm:[a-z_]+)(?:\{[^}]*\})? (\S+)$", re.MULTILINE)


class Sim:
    """A running simulator with a sync client."""

    def __init__(self, server: SimLLMServer) -> None:
        self.server = server
        self.url = server.url
        self.http = httpx.Client(base_url=server.url, timeout=60, trust_env=False)

    def complete(self, expect: int = 200, **payload: Any) -> dict[str, Any]:
        response = self.http.post("/v1/completions", json=payload)
        assert response.status_code == expect, response.text
        return response.json()

    def metrics(self) -> dict[str, float]:
        """`/metrics`, each vLLM name summed over its labels."""
        totals: dict[str, float] = {}
        for name, value in _METRIC.findall(self.http.get("/metrics").text):
            totals[name] = totals.get(name, 0.0) + float(value)
        return totals


@pytest.fixture
def start_sim() -> Iterator[Callable[..., Sim]]:
    """Start simulators on demand (SimLLMSettings fields); all are stopped at teardown."""
    started: list[Sim] = []

    def start(**fields: Any) -> Sim:
        sim = Sim(SimLLMServer(**fields).start())
        started.append(sim)
        return sim

    yield start
    for sim in started:
        sim.http.close()
        sim.server.stop()


async def complete_async(client: httpx.AsyncClient, **payload: Any) -> dict[str, Any]:
    response = await client.post("/v1/completions", json=payload)
    assert response.status_code == 200, response.text
    return response.json()


def per_token(body: dict[str, Any]) -> float:
    return body["sim"]["decode_s"] / body["usage"]["completion_tokens"]


# --- timing model -------------------------------------------------------------------------------------


def test_profile_is_piecewise_linear_and_checked():
    profile = LatencyProfile.parse("1:0.020,8:0.024,32:0.035,64:0.055,128:0.095")
    assert profile.seconds_per_token(1) == 0.020
    assert profile.seconds_per_token(20) == pytest.approx(0.0295)
    assert profile.seconds_per_token(128) == pytest.approx(0.095)
    assert profile.seconds_per_token(256) == pytest.approx(0.175)  # the last segment extended
    assert LatencyProfile.parse("4:0.01").seconds_per_token(100) == 0.01
    for bad in ("", "8", "0:0.01", "1:-1", "1:nan", "8:0.02,4:0.03", "a:b"):
        with pytest.raises(ValueError):
            LatencyProfile.parse(bad)
    args = build_parser().parse_args(["sim-llm", "--profile", "1:0.01,16:0.02", "--time-scale", "60", "--seed", "3"])
    settings = settings_from_args(args)
    assert settings.profile.points == ((1, 0.01), (16, 0.02)) and settings.time_scale == 60 and settings.seed == 3


async def test_steps_last_the_profile_time_of_the_batch():
    """32 requests arriving together each see 32-request steps; one alone sees 1-request steps (exact)."""
    engine = SimEngine(SimLLMSettings(time_scale=1e5, prefill_s_per_token=0.0))
    loop = asyncio.create_task(engine.run())
    try:
        params = SamplingParams(max_tokens=50, ignore_eos=True)
        alone = await engine.generate("one", [100] * 10, params)
        batch = await asyncio.gather(*(engine.generate(f"r{i}", [200 + i] * 10, params) for i in range(32)))
    finally:
        loop.cancel()
    assert alone[1].decode_s == pytest.approx(50 * 0.020)
    assert {round(timing.decode_s, 9) for _, timing in batch} == {round(50 * 0.035, 9)}
    assert len({timing.finished_s for _, timing in batch}) == 1  # admitted together, ended together


async def test_a_model_parallel_worker_steps_by_the_scaled_profile():
    """A degree-4 worker (efficiency 0.8 per doubling) is 4 x 0.64 = 2.56x faster per step at every batch."""
    settings = SimLLMSettings(time_scale=1e5, prefill_s_per_token=0.0, model_parallel=4, parallel_efficiency=0.8)
    assert settings.step_profile.seconds_per_token(32) == pytest.approx(0.035 / 2.56)
    engine = SimEngine(settings)
    loop = asyncio.create_task(engine.run())
    try:
        _, timing = await engine.generate("one", [100] * 10, SamplingParams(max_tokens=50, ignore_eos=True))
    finally:
        loop.cancel()
    assert timing.decode_s == pytest.approx(50 * 0.020 / 2.56)
    args = build_parser().parse_args(["sim-llm", "--model-parallel", "2", "--parallel-efficiency", "0.9"])
    assert settings_from_args(args).step_profile.seconds_per_token(1) == pytest.approx(0.020 / 1.8)


async def test_reported_times_follow_the_profile_over_http(start_sim):
    sim = start_sim(time_scale=5.0, prefill_s_per_token=0.0)  # others' prefill would lengthen shared steps
    prompt = list(range(100, 164))
    one = sim.complete(prompt=prompt, max_tokens=40, ignore_eos=True)
    assert one["usage"]["completion_tokens"] == 40 and one["choices"][0]["finish_reason"] == "length"
    assert per_token(one) == pytest.approx(0.020)
    assert one["sim"]["queue_s"] == 0 and one["sim"]["prefill_tokens"] == 64

    async def thirty_two() -> list[dict[str, Any]]:
        async with httpx.AsyncClient(base_url=sim.url, timeout=60, trust_env=False) as client:
            return await asyncio.gather(
                *(complete_async(client, prompt=[i + 11] * 8, max_tokens=100, ignore_eos=True) for i in range(32))
            )

    bodies = await thirty_two()
    times = [per_token(body) for body in bodies]
    # requests arrive over a few wall milliseconds, so some steps run fewer than 32: never more than 32
    assert max(times) <= 0.035 + 1e-9
    assert max(times) > 0.030 and statistics.median(times) > 0.025


# --- prefix cache ----------------------------------------------------------------------------------------


def test_prefix_cache_block_lru():
    cache = PrefixCache(block_size=4, capacity=3)
    cache.insert(list(range(12)), None)
    assert cache.lookup(list(range(12)), None) == 8  # the last token is always computed
    assert cache.lookup([*range(8), 99, 99, 99, 99, 7], None) == 8
    assert cache.lookup(list(range(12)), "salt") == 0
    cache.insert([50] * 8, None)  # evicts the least recently used blocks
    assert len(cache) == 3 and cache.lookup([50] * 9, None) == 8


def test_prefix_cache_hits_and_salt_namespaces(start_sim):
    sim = start_sim(time_scale=FAST)
    prompt = list(range(1000, 1100))  # 100 tokens: 6 whole blocks of 16 before the last token
    first = sim.complete(prompt=prompt, max_tokens=20, ignore_eos=True, return_token_ids=True)
    again = sim.complete(prompt=prompt, max_tokens=5)
    salted = sim.complete(prompt=prompt, max_tokens=5, cache_salt="job-a")
    salted_again = sim.complete(prompt=prompt, max_tokens=5, cache_salt="job-a")
    other_salt = sim.complete(prompt=prompt, max_tokens=5, cache_salt="job-b")
    cached = [b["sim"]["cached_tokens"] for b in (first, again, salted, salted_again, other_salt)]
    assert cached == [0, 96, 0, 96, 0]
    assert again["sim"]["prefill_s"] == pytest.approx(4 * PREFILL)
    metrics = sim.metrics()
    assert metrics["vllm:prefix_cache_queries_total"] == 500
    assert metrics["vllm:prefix_cache_hits_total"] == 192
    # the next turn of a conversation reuses the blocks of the previous prompt and its output
    turn2 = prompt + first["choices"][0]["token_ids"] + [7] * 30
    assert sim.complete(prompt=turn2, max_tokens=5)["sim"]["cached_tokens"] == 112  # 7 blocks of the 120


# --- scheduling ----------------------------------------------------------------------------------------------


async def test_waiting_requests_run_by_priority(start_sim):
    sim = start_sim(time_scale=20.0, max_num_seqs=1)
    async with httpx.AsyncClient(base_url=sim.url, timeout=60, trust_env=False) as client:
        blocker = asyncio.create_task(complete_async(client, prompt=[5] * 4, max_tokens=1500, ignore_eos=True))
        await asyncio.to_thread(wait_for, lambda: sim.metrics()["vllm:num_requests_running"] == 1, 10, "blocker runs")
        queued = []
        for priority in (5, 1, 3):
            body = {"prompt": [priority + 20] * 4, "max_tokens": 3, "ignore_eos": True, "priority": priority}
            queued.append(asyncio.create_task(complete_async(client, **body)))
            await asyncio.sleep(0.02)
        await asyncio.to_thread(wait_for, lambda: sim.metrics()["vllm:num_requests_waiting"] == 3, 10, "3 waiting")
        first, second, third = await asyncio.gather(*queued)
        await blocker
    finished = {p: body["sim"]["finished_s"] for p, body in zip((5, 1, 3), (first, second, third), strict=True)}
    assert finished[1] < finished[3] < finished[5]
    assert sim.metrics()["vllm:num_preemptions_total"] == 0  # priority 0 running: nobody better waits


async def test_better_priority_preempts_the_worst_running(start_sim):
    sim = start_sim(time_scale=20.0, max_num_seqs=2)
    async with httpx.AsyncClient(base_url=sim.url, timeout=60, trust_env=False) as client:
        low = [  # prompts of 41 tokens sharing no block, whichever arrives first
            asyncio.create_task(
                complete_async(
                    client,
                    prompt=list(range(300 + 100 * i, 341 + 100 * i)),
                    max_tokens=2000,
                    ignore_eos=True,
                    priority=10 + i,
                )
            )
            for i in range(2)
        ]
        await asyncio.to_thread(wait_for, lambda: sim.metrics()["vllm:num_requests_running"] == 2, 10, "batch full")
        await asyncio.sleep(0.1)  # both have generated some tokens
        urgent = await complete_async(client, prompt=[9] * 10, max_tokens=10, ignore_eos=True, priority=0)
        assert sim.metrics()["vllm:num_preemptions_total"] == 1
        better, worse = await asyncio.gather(*low)
    # the urgent request ran at once: its wait is at most the step it arrived in
    assert urgent["sim"]["queue_s"] <= 0.03 and urgent["sim"]["preemptions"] == 0
    assert better["sim"]["preemptions"] == 0 and better["sim"]["prefill_tokens"] == 41
    # the worst running (priority 11) was preempted, waited, and recomputed its prompt and its tokens so far
    assert worse["sim"]["preemptions"] == 1 and worse["sim"]["queue_s"] > 0
    assert worse["sim"]["prefill_tokens"] > 2 * 41
    assert worse["usage"]["completion_tokens"] == 2000 and worse["choices"][0]["finish_reason"] == "length"
    assert worse["sim"]["finished_s"] > better["sim"]["finished_s"]


# --- outputs and determinism -------------------------------------------------------------------------------------


def test_outputs_are_valid_and_lengths_drawn_from_the_distribution(start_sim):
    sim = start_sim(time_scale=FAST, output_len_median=20, output_len_sigma=0.8)
    lengths = set()
    for i in range(12):
        body = sim.complete(prompt=[40 + i] * 5, max_tokens=200, logprobs=2, return_token_ids=True)
        choice = body["choices"][0]
        ids, logprobs = choice["token_ids"], choice["logprobs"]["token_logprobs"]
        lengths.add(len(ids))
        assert len(logprobs) == len(ids) == body["usage"]["completion_tokens"]
        assert all(-1e4 < lp <= 0 for lp in logprobs)
        assert all(len(top) == 3 for top in choice["logprobs"]["top_logprobs"])
        if choice["finish_reason"] == "stop":
            assert ids[-1] == EOS and EOS not in ids[:-1] and choice["stop_reason"] is None
        end = "<|im_end|>" if choice["finish_reason"] == "stop" else ""
        assert sim.http.post("/detokenize", json={"tokens": ids}).json()["prompt"] == choice["text"] + end
    assert len(lengths) > 3
    exact = sim.complete(prompt="hello world", max_tokens=37, ignore_eos=True)
    assert exact["usage"] == {"prompt_tokens": 11, "completion_tokens": 37, "total_tokens": 48}
    stopped = sim.complete(prompt=[3] * 4, max_tokens=300, ignore_eos=True, stop_token_ids=[42], return_token_ids=True)
    assert stopped["choices"][0]["stop_reason"] == 42 and stopped["choices"][0]["token_ids"][-1] == 42


def test_same_seed_same_outputs_and_simulated_times(start_sim):
    requests = [
        {"prompt": list(range(500, 600)), "max_tokens": 50},
        {"prompt": list(range(500, 600)), "max_tokens": 50},  # same prompt, no seed: another sample
        {"prompt": "a text prompt", "max_tokens": 30, "logprobs": 1},
        {"prompt": [7] * 33, "max_tokens": 20, "temperature": 0},
        {"prompt": [8] * 33, "max_tokens": 20, "seed": 11, "cache_salt": "s"},
    ]

    def run(seed: int) -> list[tuple[Any, ...]]:
        sim = start_sim(time_scale=FAST, seed=seed, output_len_median=25)
        out = []
        for request in requests:
            body = sim.complete(**request, return_token_ids=True)
            choice, timing = body["choices"][0], body["sim"]
            times = (timing["queue_s"], timing["prefill_s"], timing["decode_s"], timing["cached_tokens"])
            out.append((choice["token_ids"], choice["logprobs"], choice["finish_reason"], times))
        return out

    first, second, other = run(7), run(7), run(8)
    assert first == second
    assert first[0][0] != first[1][0]
    assert [r[0] for r in first] != [r[0] for r in other]


# --- protocol ---------------------------------------------------------------------------------------------------


def test_models_tokenize_detokenize_health(start_sim):
    sim = start_sim(time_scale=FAST, max_model_len=2048, model_name="sim-7b")
    card = sim.http.get("/v1/models").json()["data"][0]
    assert card["id"] == "sim-7b" and card["max_model_len"] == 2048
    assert sim.http.get("/health").status_code == 200
    messages = [{"role": "user", "content": "hi"}]
    ids = sim.http.post("/tokenize", json={"messages": messages}).json()["tokens"]
    assert sim.http.post("/detokenize", json={"tokens": ids}).json()["prompt"] == (
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    )
    text = sim.http.post("/tokenize", json={"prompt": "ab", "return_token_strs": True}).json()
    assert text["tokens"] == [107, 108] and text["token_strs"] == ["a", "b"]
    assert sim.complete(model="sim-7b", prompt=[1, 2], max_tokens=1)["model"] == "sim-7b"


@pytest.mark.parametrize(
    ("path", "payload", "status", "param"),
    [
        ("/v1/completions", {"prompt": [1], "temperature": -1}, 400, "temperature"),
        ("/v1/completions", {"prompt": [1], "temperature": "hot"}, 400, "body.temperature"),
        ("/v1/completions", {"prompt": [1], "logprobs": 21}, 400, "logprobs"),
        ("/v1/completions", {"prompt": [1], "max_tokens": 5000}, 400, "max_tokens"),
        ("/v1/completions", {"prompt": [1] * 3000, "max_tokens": 100}, 400, "input_tokens"),
        ("/v1/completions", {"prompt": []}, 400, None),
        ("/v1/completions", {"prompt": [2_000_000]}, 400, None),
        ("/v1/completions", {"prompt": [1], "cache_salt": ""}, 400, "cache_salt"),
        ("/v1/completions", {"prompt": [1], "stream": True}, 400, "stream"),
        ("/v1/completions", {"prompt": [1], "model": "gpt-9"}, 404, "model"),
        ("/tokenize", {"messages": [{"content": "no role"}]}, 400, "messages"),
        ("/detokenize", {"tokens": [-1]}, 400, "body.tokens.0"),
    ],
)
def test_bad_requests_get_vllm_errors(start_sim, path, payload, status, param):
    sim = start_sim(time_scale=FAST, max_model_len=2048)
    response = sim.http.post(path, json=payload)
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["code"] == status and error["param"] == param and error["message"]
    assert error["type"] in {"BadRequestError", "Bad Request", "NotFoundError"}


def test_client_disconnect_aborts_the_request(start_sim):
    sim = start_sim(time_scale=1.0)
    body = {"prompt": [5] * 10, "max_tokens": 20000, "ignore_eos": True}

    def walk_away() -> None:
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(f"{sim.url}/v1/completions", json=body, timeout=httpx.Timeout(60, read=0.5), trust_env=False)

    client = threading.Thread(target=walk_away)
    client.start()
    wait_for(lambda: sim.metrics()["vllm:num_requests_running"] == 1, 10, "the request runs")
    client.join()
    wait_for(lambda: sim.metrics()["vllm:num_requests_running"] == 0, 10, "the request is aborted")
    assert sim.metrics()["vllm:request_success_total"] == 1  # finished_reason="abort"


def test_the_command_serves_until_terminated():
    port = free_port()
    command = [sys.executable, "-m", "prorl_server.cli", "sim-llm", "--port", str(port), "--time-scale", "50"]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert "prorl-server sim-llm ready" in process.stdout.readline()
        body = {"prompt": "hi", "max_tokens": 3, "ignore_eos": True}
        answer = httpx.post(f"http://127.0.0.1:{port}/v1/completions", json=body, timeout=30, trust_env=False)
        assert answer.json()["usage"]["completion_tokens"] == 3
    finally:
        process.terminate()
        process.communicate(timeout=30)
    assert process.returncode in (0, -15)  # uvicorn re-raises the SIGTERM it handled


# --- through prorl-server ----------------------------------------------------------------------------------------


def test_prorl_server_runs_a_multi_turn_job_against_it(start_sim, start_server):
    sim = start_sim(time_scale=FAST, output_len_median=12)
    server = start_server([sim.server.address])
    body = {
        "instance": {"data_source": "multiturn", "question": "q"},
        "sampling_params": {"max_tokens": 40, "max_turns": 3},
    }
    result = server.http.post("/process", json=body).json()
    assert result["status"] == "completed", result
    traj = result["trajectory"]
    turns = traj["turns"]
    assert len(turns) == 3 and result["eval"] == {"turns": 3}  # the simulator never says DONE
    assert all(t["backend"] == sim.server.address and 1 <= len(t["output_ids"]) <= 40 for t in turns)
    assert all(-1e4 < lp <= 0 for t in turns for lp in t["logprobs"])
    assert len(traj["response_ids"]) == len(traj["response_mask"]) == len(traj["response_logprobs"])
    # each turn's prompt extends the last: later turns hit the prefix cache
    assert sim.metrics()["vllm:prefix_cache_hits_total"] > 0


def test_keep_pause_freezes_the_steps_and_labels_each_token(start_sim):
    sim = start_sim(time_scale=1.0)
    assert sim.http.post("/update_weight_version", json={"new_version": "1"}).json()["success"] is True
    body = {"prompt": [5] * 10, "max_tokens": 200, "ignore_eos": True, "return_token_ids": True}
    answers: list[dict[str, Any]] = []

    def complete() -> None:  # its own connection: the test's client is used meanwhile
        answers.append(httpx.post(f"{sim.url}/v1/completions", json=body, timeout=60, trust_env=False).json())

    client = threading.Thread(target=complete)
    client.start()
    wait_for(lambda: sim.server.engine.decoded_in_flight >= 5, 10, "some tokens decoded")
    assert sim.http.post("/pause", params={"mode": "keep"}).json() == {"status": "paused"}
    assert sim.http.get("/is_paused").json() == {"is_paused": True}
    frozen = sim.server.engine.decoded_in_flight
    time.sleep(0.3)  # 15 steps' worth at batch 1
    assert sim.server.engine.decoded_in_flight == frozen
    sim.http.post("/update_weight_version", json={"new_version": "2"})
    assert sim.http.post("/resume").json() == {"status": "resumed"}
    client.join(30)
    (choice,) = answers[0]["choices"]
    assert len(choice["token_ids"]) == 200
    assert choice["weight_versions"] == [
        {"version": "1", "start": 0, "end": frozen},
        {"version": "2", "start": frozen, "end": 200},
    ]
    refused = sim.http.post("/pause", params={"mode": "abort"})
    assert refused.status_code == 400 and "mode=keep only" in refused.json()["error"]["message"]

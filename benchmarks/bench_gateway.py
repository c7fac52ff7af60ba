"""Benchmark: the gateway's overhead per call for each of its three APIs, and token-exactness over multi-turn chats.

Run it from the repository root::

    .venv/bin/python benchmarks/bench_gateway.py [--json out.json] [--overhead-chats 60] [--overhead-turns 4]
        [--chats 200] [--turns 3] [--max-tokens 10] [--concurrency 4] [--skip-exactness]

About 4.5 minutes on 2 busy cores with the defaults (almost all of it the dev engine sampling part 2). Every
server is a child process of this script (LocalStack, stopped by PID; they import the prorl_server of this
checkout: its `src` is put first on their PYTHONPATH); the clients are the official `openai` package (Chat
Completions, Responses) and `anthropic` package (Messages), as a harness would use them.

Part 1 - overhead (backend: the scripted test double, `python -m prorl_server.testing`, replies at once)
    `--overhead-chats` conversations of `--overhead-turns` turns, one call at a time. Each turn is sent eight
    ways, in rotating order: (a) straight to the double's own `POST /v1/chat/completions` with `openai` (what
    the harness would call without the gateway), (b) straight to the double as the gateway's two
    token-in/token-out requests (`POST /tokenize` of the new messages, `POST /v1/completions` with prompt
    ids), and through prorl-server gateway sessions on the same double (a session per API and
    conversation): (c) Chat Completions (`openai` `chat.completions.create`), (d) Responses (`openai`
    `responses.create`, the whole conversation as input items, `store=False`), (e) Anthropic Messages
    (`anthropic` `messages.create`), and (f), (g), (h): the same three through a second server whose
    double (`--tokenizer-dir`) publishes its tokenizer as Hugging Face files, so that server tokenizes the
    chats itself (README, "token in and token out") and a call is one backend request, not two; the script
    checks in `/llm_servers` that the first server tokenizes by `/tokenize` and the second in the server.
    The figures are client-observed latencies; "added" is the p50 (p99) of an
    API's way minus the p50 (p99) of (a), and minus (b): what the gateway itself costs (its HTTP hop, its
    work, and for (d) and (e) the translation to and from the chat completion), beyond the backend requests
    any token-exact recording needs. The client library is part of each figure: (e) is the `anthropic`
    package (its own HTTP client), the others `openai` on one shared `httpx` client. The first turn of each
    conversation also pins the session (the double's `/v1/models` once per server) and tokenizes the whole
    prompt, as every later turn tokenizes only its new messages. One untimed conversation warms every way
    up first (imports, connections). Each session must end as one segment with one call per turn. Then,
    per API, the server process's CPU time per call (/proc, all its threads): `--overhead-chats`
    conversations sent back to back through that API alone, less noisy than latency on a busy machine.
Part 2 - token-exactness (backend: the dev engine, SmolLM2-135M, `prorl-server dev-llm --debug-sampled`)
    `--chats` conversations of `--turns` turns through gateway sessions (`--concurrency` at once; sampling at
    temperature 1 fixed by the trainer, `max_tokens` `--max-tokens`), a third of them each through Chat
    Completions, Responses and Messages (chat i through the API i mod 3, with the same clients as part 1),
    each closed with `DELETE /sessions/{id}`. Chat Completions sends a seed per turn (`chat * 100 + turn`,
    allowed by `harness_params: ["seed"]`); Responses and Messages have no seed field, so their session's
    sampling params carry `seed: chat * 100` for all its turns. Every recorded turn is matched with the
    engine's own record of the request (`GET /debug/sampled`: same prompt ids and seed): the figure is the
    share of model tokens whose id AND logprob are exactly what the engine sampled; also each reply's text
    must be the turn's, and each conversation one segment without rewrites. Target: 100%.

JSON output (`--json PATH`)::

    {
      "machine": {"cpus", "python", "load_avg_1m_at_start"},
      "config": {every command-line option},
      "overhead": {"calls" (per way), "direct_chat_ms", "direct_tito_ms" (each {"p50", "p99"}),
                   "apis": {"chat" | "responses" | "messages" | "chat_local" | "responses_local" |
                            "messages_local" (tokenized in the server): {
                       "gateway_ms": {"p50", "p99"},
                       "added_p50_ms", "added_p99_ms" (gateway minus direct chat),
                       "added_over_tito_p50_ms", "added_over_tito_p99_ms" (gateway minus direct tito),
                       "server_cpu_ms_per_call" (the server process's CPU per call, from /proc)}},
                   "gateway_ms", "added_p50_ms", "added_p99_ms", "added_over_tito_p50_ms",
                   "added_over_tito_p99_ms" (the same for Chat Completions, as earlier versions wrote them)},
      "exactness": {"chats", "turns", "model_tokens", "tokens_matching", "share_matching", "turns_unmatched",
                    "texts_differing", "segments", "rewrites", "failed_chats",
                    "per_api": {"chat" | "responses" | "messages": {"chats", "failed_chats", "model_tokens",
                                                                    "tokens_matching"}},
                    "first_error" (of a failed chat, or null), "wall_s"},
      "checks": [{"metric", "value", "baseline", "target", "pass"}],
      "elapsed_s"
    }

Exit code 0 whatever the figures; 1 only if a part could not run at all.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
from _report import check, children_run_this_checkout, finish, percentile_ms, positive_int, print_checks, report_header

from prorl_server.launch import LocalStack, auth_headers
from prorl_server.launch.local_stack import free_port
from prorl_server.testing.scripted_backend import MODEL_NAME

REPLY = "The answer is forty-two, as usual."
QUESTIONS = [
    "Name three colors of the rainbow.",
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "How do I boil an egg?",
    "What is 12 times 12?",
    "Why is the sky blue?",
]
FOLLOW_UPS = ["Tell me more.", "Say it in fewer words.", "Give an example.", "Thanks, and one more thing?"]
_BASE = [{"role": "user", "content": "A"}, {"role": "assistant", "content": "A"}]


def server_options(llm: str) -> list[str]:
    return ["--llm-server", llm, "--no-entry-points", "--runtime", "local", "--log-level", "warning"]


def open_session(server: str, http: httpx.Client, **body: Any) -> dict[str, Any]:
    return http.post(f"{server}/sessions", json=body).raise_for_status().json()


# part 1 ---------------------------------------------------------------------------------------------------


API_WAYS = ("gateway_chat", "gateway_responses", "gateway_messages")
LOCAL_WAYS = ("local_chat", "local_responses", "local_messages")
WAYS = ("direct_chat", "direct_tito", *API_WAYS, *LOCAL_WAYS)
API_LABELS = {
    "gateway_chat": "Chat Completions",
    "gateway_responses": "Responses",
    "gateway_messages": "Anthropic Messages",
    "local_chat": "Chat Completions, tokenized in the server",
    "local_responses": "Responses, tokenized in the server",
    "local_messages": "Anthropic Messages, tokenized in the server",
}


def api_of(way: str) -> str:
    """The API of a gateway way: chat, responses or messages."""
    return way.split("_", 1)[1]


def report_key(way: str) -> str:
    """The way's key under `overhead.apis`: the API, with `_local` when the server tokenizes."""
    return api_of(way) + ("_local" if way in LOCAL_WAYS else "")


def start_double(stack: LocalStack, tokenizer_dir: Path | None = None) -> str:
    """A scripted double (its address); with `tokenizer_dir`, it publishes its tokenizer there as its root."""
    port = free_port()
    double = f"http://127.0.0.1:{port}"
    argv = [sys.executable, "-m", "prorl_server.testing", "--port", str(port), "--default-reply", REPLY]
    if tokenizer_dir is not None:
        argv += ["--tokenizer-dir", str(tokenizer_dir)]
    stack.launch("scripted_double", argv, f"{double}/health")
    return double


def check_tokenization(server: str, http: httpx.Client, expected: str) -> None:
    """Fail unless the server's one backend is tokenized as `expected` (local, or backend): the figures of a
    way are only what they say when its server chose as meant."""
    deadline = time.monotonic() + 60
    while True:
        [backend] = http.get(f"{server}/llm_servers").raise_for_status().json()["servers"]
        if backend.get("tokenization") == expected:
            return
        if time.monotonic() > deadline:
            raise RuntimeError(
                f"{server}: the backend's tokenization is {backend.get('tokenization')!r}, not {expected!r}"
            )
        time.sleep(0.1)


def measure_overhead(stack: LocalStack, args: argparse.Namespace) -> dict[str, Any]:
    """Latency of the eight ways per turn (two direct, three gateway APIs tokenizing by the backend's
    /tokenize, the same three tokenizing in the server), one call at a time."""
    double = start_double(stack)
    server = stack.server(*server_options(f"{double}/v1"))
    server_pid = stack.procs[-1].pid
    local_double = start_double(stack, stack.log_dir / "tokenizer")
    local_server = stack.server(*server_options(f"{local_double}/v1"))
    local_pid = stack.procs[-1].pid
    servers = {way: server for way in API_WAYS} | {way: local_server for way in LOCAL_WAYS}
    times: dict[str, list[float]] = {way: [] for way in WAYS}
    http = httpx.Client(timeout=60, trust_env=False, headers=auth_headers())  # the servers' key (LocalStack)
    direct = openai.OpenAI(base_url=f"{double}/v1", api_key="none", max_retries=0, http_client=http)
    gateway_ways = (*API_WAYS, *LOCAL_WAYS)
    try:
        check_tokenization(server, http, "backend")
        check_tokenization(local_server, http, "local")
        for chat in range(-1, args.overhead_chats):  # chat -1 warms up (imports, connections): not counted
            sessions = {way: open_session(servers[way], http) for way in gateway_ways}  # a recording per way
            clients = {way: api_client(way, sessions[way], http) for way in gateway_ways}
            messages: list[dict[str, Any]] = [{"role": "user", "content": QUESTIONS[chat % len(QUESTIONS)]}]
            prompt_ids: list[int] = []
            new: list[dict[str, Any]] = list(messages)
            for turn in range(args.overhead_turns):
                shift = (chat * args.overhead_turns + turn) % len(WAYS)
                for way in WAYS[shift:] + WAYS[:shift]:
                    started = time.perf_counter()
                    if way == "direct_chat":
                        direct.chat.completions.create(model=MODEL_NAME, messages=messages)
                    elif way == "direct_tito":
                        prompt_ids = tito_turn(http, double, prompt_ids, new)
                    else:
                        api_call(way, clients[way], sessions[way]["model"], messages)
                    if chat >= 0:
                        times[way].append(time.perf_counter() - started)
                new = [{"role": "user", "content": FOLLOW_UPS[turn % len(FOLLOW_UPS)]}]
                messages += [{"role": "assistant", "content": REPLY}, *new]
            for way in gateway_ways:
                url = f"{servers[way]}/sessions/{sessions[way]['session_id']}"
                record = http.delete(url).raise_for_status().json()
                if len(record["segments"]) != 1 or record["calls"] != args.overhead_turns:
                    raise RuntimeError(f"{way}: {len(record['segments'])} segments, {record['calls']} calls")
        pids = {way: server_pid for way in API_WAYS} | {way: local_pid for way in LOCAL_WAYS}
        cpu = {way: server_cpu_per_call(servers[way], pids[way], http, way, args) for way in gateway_ways}
    finally:
        http.close()
    summary = {way: {"p50": percentile_ms(v, 50), "p99": percentile_ms(v, 99)} for way, v in times.items()}
    chat_, tito = summary["direct_chat"], summary["direct_tito"]
    apis = {}
    for way in gateway_ways:
        gw = summary[way]
        apis[report_key(way)] = {
            "gateway_ms": gw,
            "added_p50_ms": gw["p50"] - chat_["p50"],
            "added_p99_ms": gw["p99"] - chat_["p99"],
            "added_over_tito_p50_ms": gw["p50"] - tito["p50"],
            "added_over_tito_p99_ms": gw["p99"] - tito["p99"],
            "server_cpu_ms_per_call": cpu[way],
        }
    return {
        "calls": len(times["gateway_chat"]),
        "direct_chat_ms": chat_,
        "direct_tito_ms": tito,
        "apis": apis,
        # Chat Completions under the keys of the earlier version of this script
        "gateway_ms": apis["chat"]["gateway_ms"],
        **{k: v for k, v in apis["chat"].items() if k.startswith("added")},
    }


def server_cpu_per_call(server: str, pid: int, http: httpx.Client, way: str, args: argparse.Namespace) -> float:
    """The server process's CPU milliseconds per call of API `way`: `--overhead-chats` conversations of
    `--overhead-turns` turns sent back to back (sessions opened before and closed after the measurement)."""
    sessions = [open_session(server, http) for _ in range(args.overhead_chats)]
    clients = [api_client(way, session, http) for session in sessions]
    api_call(way, clients[0], sessions[0]["model"], [{"role": "user", "content": "warm up"}])  # not counted
    calls = 0
    before = process_cpu_s(pid)
    for chat, (session, client) in enumerate(zip(sessions[1:], clients[1:], strict=True)):
        messages: list[dict[str, Any]] = [{"role": "user", "content": QUESTIONS[chat % len(QUESTIONS)]}]
        for turn in range(args.overhead_turns):
            api_call(way, client, session["model"], messages)
            calls += 1
            messages += [{"role": "assistant", "content": REPLY}]
            messages += [{"role": "user", "content": FOLLOW_UPS[turn % len(FOLLOW_UPS)]}]
    used = process_cpu_s(pid) - before
    for session in sessions:
        http.delete(f"{server}/sessions/{session['session_id']}").raise_for_status()
    return 1000 * used / max(calls, 1)


def process_cpu_s(pid: int) -> float:
    """User + system CPU seconds of process `pid`, all its threads (clock-tick resolution)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def label_way(key: str) -> str:
    """The way of an `overhead.apis` key."""
    return f"local_{key.removesuffix('_local')}" if key.endswith("_local") else f"gateway_{key}"


def api_client(way: str, session: dict[str, Any], http: httpx.Client) -> Any:
    """The official client of API `way` on `session`."""
    if api_of(way) == "messages":  # its own HTTP client: this SDK's is not httpx's
        return anthropic.Anthropic(
            base_url=session["base_url"].removesuffix("/v1"), api_key=session["api_key"], max_retries=0
        )
    return openai.OpenAI(base_url=session["base_url"], api_key=session["api_key"], max_retries=0, http_client=http)


def api_call(way: str, client: Any, model: str, messages: list[dict[str, Any]]) -> str:
    """One turn of `messages` (user and assistant messages with string content) through a gateway API with
    its official client; returns the reply's text."""
    if api_of(way) == "chat":
        return client.chat.completions.create(model=model, messages=messages).choices[0].message.content or ""
    if api_of(way) == "responses":
        return client.responses.create(model=model, input=messages, store=False).output_text
    reply = client.messages.create(model=model, max_tokens=64, messages=messages)
    return "".join(block.text for block in reply.content if block.type == "text")


def tito_turn(http: httpx.Client, double: str, prompt_ids: list[int], new: list[dict[str, Any]]) -> list[int]:
    """The gateway's two requests for one turn, sent straight to the double; returns the context after it."""
    if prompt_ids:
        body = {"messages": [*_BASE, *new], "add_generation_prompt": True, "add_special_tokens": False}
    else:
        body = {"messages": new, "add_generation_prompt": True, "add_special_tokens": False}
    ids = http.post(f"{double}/tokenize", json=body).raise_for_status().json()["tokens"]
    prompt = prompt_ids + ids
    completion = http.post(
        f"{double}/v1/completions",
        json={"model": MODEL_NAME, "prompt": prompt, "return_token_ids": True, "logprobs": 0, "max_tokens": 64},
    ).raise_for_status()
    return prompt + completion.json()["choices"][0]["token_ids"]


# part 2 ---------------------------------------------------------------------------------------------------


def measure_exactness(stack: LocalStack, args: argparse.Namespace) -> dict[str, Any]:
    """Run the conversations through gateway sessions on the dev engine and compare with its record."""
    print("starting the dev engine (SmolLM2-135M, 2 slots) and prorl-server ...", flush=True)
    llm = stack.dev_llm("--slots", "2", "--debug-sampled", str(args.chats * args.turns + 100))
    server = stack.server(*server_options(llm))
    print(f"running {args.chats} chats of {args.turns} turns through gateway sessions", flush=True)
    started = time.monotonic()
    outcomes = asyncio.run(run_chats(server, args))
    wall = time.monotonic() - started
    with httpx.Client(timeout=60, trust_env=False) as http:
        sampled = http.get(f"{llm.removesuffix('/v1')}/debug/sampled").json()
    records = {(tuple(r["prompt_ids"]), r["seed"]): r for r in sampled}
    figures = {"model_tokens": 0, "tokens_matching": 0, "turns": 0, "turns_unmatched": 0, "texts_differing": 0}
    segments = rewrites = failed = 0
    per_api = {api: {"chats": 0, "failed_chats": 0, "model_tokens": 0, "tokens_matching": 0} for api in APIS}
    for chat, outcome in enumerate(outcomes):
        api = per_api[chat_api(chat)]
        api["chats"] += 1
        if isinstance(outcome, BaseException):
            failed += 1
            api["failed_chats"] += 1
            continue
        record, replies, seeds = outcome
        segments += len(record["segments"])
        rewrites += record["rewrites"]
        turns = [(segment, turn) for segment in record["segments"] for turn in segment["turns"]]
        for (segment, turn), reply, seed in zip(turns, replies, seeds, strict=False):
            figures["turns"] += 1
            figures["model_tokens"] += len(turn["output_ids"])
            api["model_tokens"] += len(turn["output_ids"])
            figures["texts_differing"] += reply != turn["text"]
            context = segment["prompt_ids"] + segment["response_ids"]
            engine = records.get((tuple(context[: turn["prompt_len"]]), seed))
            if engine is None:
                figures["turns_unmatched"] += 1
                continue
            matching = sum(
                1
                for i, (token, logprob) in enumerate(zip(turn["output_ids"], turn["logprobs"], strict=True))
                if i < len(engine["output_ids"])
                and token == engine["output_ids"][i]
                and logprob == engine["logprobs"][i]
            )
            figures["tokens_matching"] += matching
            api["tokens_matching"] += matching
    share = figures["tokens_matching"] / figures["model_tokens"] if figures["model_tokens"] else None
    return {
        "chats": args.chats,
        **figures,
        "share_matching": share,
        "segments": segments,
        "rewrites": rewrites,
        "failed_chats": failed,
        "per_api": per_api,
        "first_error": next((f"{type(o).__name__}: {o}" for o in outcomes if isinstance(o, BaseException)), None),
        "wall_s": round(wall, 1),
    }


async def run_chats(server: str, args: argparse.Namespace) -> list[Any]:
    limit = asyncio.Semaphore(args.concurrency)
    async with httpx.AsyncClient(timeout=600, trust_env=False, headers=auth_headers()) as http:

        async def one(chat: int) -> tuple[dict[str, Any], list[str], list[int]]:
            async with limit:
                return await run_chat(server, http, chat, args)

        return await asyncio.gather(*(one(i) for i in range(args.chats)), return_exceptions=True)


async def run_chat(
    server: str, http: httpx.AsyncClient, chat: int, args: argparse.Namespace
) -> tuple[dict[str, Any], list[str], list[int]]:
    """One conversation through the API `chat_api(chat)`: its recording, the replies the harness got, and the
    seed of each turn. Chat Completions sends its own seed per turn (`harness_params: ["seed"]`); Responses and
    Messages have no seed field, so their session's sampling params carry one for every turn of the chat."""
    api = chat_api(chat)
    sampling: dict[str, Any] = {"temperature": 1.0, "max_tokens": args.max_tokens}
    harness = ["seed"]
    if api != "chat":
        sampling["seed"] = chat * 100
        harness = []  # max_tokens (and max_output_tokens) of the harness ignored: the trainer's
    opened = await http.post(f"{server}/sessions", json={"sampling_params": sampling, "harness_params": harness})
    session = opened.raise_for_status().json()
    messages: list[dict[str, Any]] = [{"role": "user", "content": QUESTIONS[chat % len(QUESTIONS)]}]
    replies: list[str] = []
    seeds: list[int] = []
    openai_client = openai.AsyncOpenAI(
        base_url=session["base_url"], api_key=session["api_key"], max_retries=0, timeout=600
    )
    anthropic_client = anthropic.AsyncAnthropic(
        base_url=session["base_url"].removesuffix("/v1"), api_key=session["api_key"], max_retries=0, timeout=600
    )
    try:
        for turn in range(args.turns):
            seed = chat * 100 + turn if api == "chat" else chat * 100
            if api == "chat":
                answer = await openai_client.chat.completions.create(
                    model=session["model"], messages=messages, seed=seed
                )
                text = answer.choices[0].message.content or ""
            elif api == "responses":
                response = await openai_client.responses.create(model=session["model"], input=messages, store=False)
                text = response.output_text
            else:
                message = await anthropic_client.messages.create(
                    model=session["model"], max_tokens=args.max_tokens, messages=messages
                )
                text = "".join(block.text for block in message.content if block.type == "text")
            replies.append(text)
            seeds.append(seed)
            messages += [{"role": "assistant", "content": text}, {"role": "user", "content": FOLLOW_UPS[turn % 4]}]
    finally:
        await openai_client.close()
        await anthropic_client.close()
        closed = await http.delete(f"{server}/sessions/{session['session_id']}")
    return closed.raise_for_status().json(), replies, seeds


APIS = ("chat", "responses", "messages")


def chat_api(chat: int) -> str:
    """The API conversation `chat` of part 2 goes through: a third of them each."""
    return APIS[chat % len(APIS)]


# report ---------------------------------------------------------------------------------------------------


def build_checks(report: dict[str, Any]) -> list[dict[str, Any]]:
    rows = []
    if "overhead" in report:
        o = report["overhead"]
        for api, a in o["apis"].items():
            rows.append(
                check(
                    f"gateway added latency per call, {API_LABELS[label_way(api)]}, p50 (p99)",
                    f"{a['added_p50_ms']:.2f} ms ({a['added_p99_ms']:.2f} ms)",
                    f"direct chat {o['direct_chat_ms']['p50']:.2f} ms p50",
                    "<= 1 ms p50",
                    a["added_p50_ms"] <= 1.0,
                )
            )
        for api, a in o["apis"].items():
            rows.append(
                check(
                    f"{API_LABELS[label_way(api)]} over the 2 backend requests sent directly, p50 (p99)",
                    f"{a['added_over_tito_p50_ms']:.2f} ms ({a['added_over_tito_p99_ms']:.2f} ms)",
                    f"tokenize + completions {o['direct_tito_ms']['p50']:.2f} ms p50",
                    "-",
                    None,
                )
            )
    if "exactness" in report:
        e = report["exactness"]
        share = e["share_matching"]
        rows.append(
            check(
                "model tokens recorded exactly as the dev engine sampled them (id and logprob)",
                f"{100 * share:.2f}% of {e['model_tokens']}" if share is not None else None,
                f"{e['chats']} chats, {e['turns']} turns",
                "100%",
                share == 1.0 and e["turns_unmatched"] == 0 and e["failed_chats"] == 0 and e["texts_differing"] == 0,
            )
        )
    return rows


def print_report(report: dict[str, Any]) -> None:
    if "overhead" in report:
        o = report["overhead"]
        print(f"\nOverhead (scripted double, {o['calls']} calls per way, one at a time)")
        print(f"  {'way':<62} {'p50 ms':>8} {'p99 ms':>8} {'added p50':>10} {'added p99':>10} {'server CPU':>11}")
        rows = [
            ("direct: the double's /v1/chat/completions", o["direct_chat_ms"], None),
            ("direct: /tokenize + /v1/completions (ids)", o["direct_tito_ms"], None),
        ]
        rows += [(f"gateway session, {API_LABELS[label_way(api)]}", a["gateway_ms"], a) for api, a in o["apis"].items()]
        for label, ms, added in rows:
            extra = ""
            if added:
                extra = f" {added['added_p50_ms']:>10.2f} {added['added_p99_ms']:>10.2f}"
                extra += f" {added['server_cpu_ms_per_call']:>8.2f} ms"
            print(f"  {label:<62} {ms['p50']:>8.2f} {ms['p99']:>8.2f}{extra}")
    if "exactness" in report:
        e = report["exactness"]
        print(f"\nToken-exactness (dev engine; engine's record: GET /debug/sampled; {e['wall_s']} s)")
        for key in ("chats", "turns", "model_tokens", "tokens_matching", "turns_unmatched", "texts_differing"):
            print(f"  {key:<18} {e[key]}")
        print(f"  {'segments':<18} {e['segments']} (rewrites {e['rewrites']}, failed chats {e['failed_chats']})")
        for api, a in e["per_api"].items():
            label = API_LABELS["gateway_" + api]
            print(f"  {label:<18} {a['tokens_matching']} of {a['model_tokens']} tokens exact, {a['chats']} chats")
        if e["first_error"]:
            print(f"  first error: {e['first_error'][:300]}")


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark, print the tables, optionally write JSON."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", type=Path, help="write the figures to this file")
    parser.add_argument("--overhead-chats", type=positive_int, default=60, help="conversations of part 1")
    parser.add_argument("--overhead-turns", type=positive_int, default=4, help="turns per conversation, part 1")
    parser.add_argument("--chats", type=positive_int, default=200, help="conversations of part 2")
    parser.add_argument("--turns", type=positive_int, default=3, help="turns per conversation, part 2")
    parser.add_argument("--max-tokens", type=positive_int, default=10, help="max_tokens per turn, part 2")
    parser.add_argument("--concurrency", type=positive_int, default=4, help="conversations at once, part 2")
    parser.add_argument("--skip-exactness", action="store_true", help="part 1 only (no dev engine needed)")
    args = parser.parse_args(argv)
    children_run_this_checkout()
    started = time.monotonic()
    report: dict[str, Any] = report_header(args)
    failures: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="bench-gateway-") as tmp:
        parts = [("overhead", measure_overhead)]
        if not args.skip_exactness:
            parts.append(("exactness", measure_exactness))
        for name, measure in parts:
            logs = Path(tmp) / name
            logs.mkdir()
            try:
                with LocalStack(logs) as stack:
                    report[name] = measure(stack, args)
            except Exception as exc:  # a part that cannot run at all
                failures[name] = f"{type(exc).__name__}: {exc}"
    report["checks"] = build_checks(report)
    report["elapsed_s"] = time.monotonic() - started
    print_report(report)
    print_checks(report["checks"])
    return finish(report, failures, args.json, None)


if __name__ == "__main__":
    sys.exit(main())

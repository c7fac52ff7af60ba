"""Benchmark: token fidelity of multi-turn trajectories from a real model (the real vLLM or the dev engine).

Run it from the repository root::

    .venv/bin/python benchmarks/bench_fidelity.py [--engine dev|vllm] [--json out.json] [--jobs 200] [--turns 2]
        [--max-tokens N] [--concurrency N]

`--engine vllm` (the default when `scripts/setup-vllm.sh` installed the CPU build of vLLM and this machine can
run it; the first line printed says which engine was chosen and why) starts the real vLLM serving
SmolLM2-135M-Instruct through LocalStack (max_num_seqs = `--concurrency`, default 8), a recording proxy
(prorl_server.testing.RecordingProxy, on a thread of this process) in front of it, and `prorl-server serve` whose
`--llm-server` is the proxy. About 2.5 minutes on 2 cores with the defaults, vLLM's start (25-55 s) included.
`--engine dev` (needs the devllm extra) starts `prorl-server dev-llm --debug-sampled` (SmolLM2-135M, 2 slots,
`--concurrency` default 4) and `prorl-server serve`; 2-3 minutes. Both load the follow-up handler of
fidelity_handler.py, run `--jobs` multi-turn chats through `POST /process` (sampling at temperature 1,
`--max-tokens` default 24 per turn, seeds varied) and stop every child by PID.

Part 1 - returned ids equal sampled ids
    Each assistant turn of each returned trajectory is matched with the engine's own record of that request
    (the same prompt ids and seed; the handler seeds turn t of job i with i * 100 + t): with the dev engine,
    its `GET /debug/sampled`; with vLLM, the proxy's recording of the `POST /v1/completions` request
    (`prompt`, `seed`) and of vLLM's answer (`choices[0].token_ids`, `choices[0].logprobs.token_logprobs`).
    The figure is the share of model tokens (mask 1) whose id AND logprob are exactly what the engine sent
    (the same floats after the JSON round trips). Target: 100%.
Part 2 - what a decode-then-re-encode path would have changed
    Text-based agent frameworks keep the model's turn as text and tokenize it again for the next prompt and
    for training. For each turn, the returned text is re-encoded with the engine's own tokenizer (`/tokenize`)
    and compared with the sampled ids (the end-of-turn token excluded): a trajectory counts as changed when
    any of its turns re-encodes differently, i.e. the trainer would have scored tokens the model never
    sampled.

JSON output (`--json PATH`)::

    {
      "machine": {"cpus", "python", "load_avg_1m_at_start"},
      "config": {every command-line option, with the engine's defaults filled in},
      "jobs": {"completed", "failed"},
      "fidelity": {"turns", "model_tokens", "tokens_matching", "share_matching", "turns_unmatched"},
      "reencode": {"trajectories", "trajectories_changed", "share_changed", "turns_changed", "tokens_changed"},
      "engine": {"kind" ("dev" or "vllm"), "generated_tokens", "wall_s", "tokens_per_s",
                 "start_s" (engine start to healthy), "requests_recorded" (completion requests in the engine's
                 record), "requests_failed" (recorded requests without a 200 answer carrying ids and logprobs)},
      "checks": [{"metric", "value", "baseline", "target", "pass"}],
      "elapsed_s"
    }

Exit code 0 whatever the figures; 1 only if a part could not run at all.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
from _report import check, finish, positive_int, print_checks, report_header

from prorl_server.launch import LocalStack, auth_headers
from prorl_server.testing import RecordedGeneration, RecordingProxy, UvicornThread
from prorl_server.vllm_cpu import SERVED_MODEL_NAME, VllmCpuInstall, VllmCpuSettings, unsupported_reason
from prorl_server.vllm_cpu.install import VLLM_VERSION

HANDLER_FILE = Path(__file__).resolve().parent / "fidelity_handler.py"
# per-engine defaults of --max-tokens and --concurrency: 200 two-turn chats in under 5 minutes on 2 cores
ENGINE_DEFAULTS = {"dev": {"max_tokens": 24, "concurrency": 4}, "vllm": {"max_tokens": 24, "concurrency": 8}}
ENGINE_NAMES = {"dev": "dev engine", "vllm": "vLLM"}
QUESTIONS = [
    "Name three colors of the rainbow.",
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "How do I boil an egg?",
    "What is 12 times 12?",
    "Give me a tip for learning Python.",
    "Why is the sky blue?",
    "Describe a cat in one sentence.",
    "What is a prime number?",
    "Tell me a fun fact about space.",
    "Translate 'good morning' into Spanish.",
    "What does HTTP stand for?",
    "Suggest a name for a pet goldfish.",
    "List two uses of a paperclip.",
    "What is the boiling point of water?",
    "Explain recursion to a child.",
    "What is the largest ocean?",
    "Write a sentence with the word 'lantern'.",
    "How many legs does a spider have?",
    "What is your favorite season and why?",
]


async def run_jobs(server: str, args: argparse.Namespace) -> list[dict[str, Any]]:
    """All jobs through POST /process, `--concurrency` at a time, with a progress line."""
    limit = asyncio.Semaphore(args.concurrency)
    done: list[dict[str, Any]] = []

    async def one(http: httpx.AsyncClient, i: int) -> None:
        instance = {"data_source": "followup", "question": QUESTIONS[i % len(QUESTIONS)], "seed": i}
        sampling = {"temperature": 1.0, "max_tokens": args.max_tokens, "turns": args.turns}
        body = {"job_id": f"fidelity-{i}", "instance": instance, "sampling_params": sampling}
        async with limit:
            response = await http.post(f"{server}/process", json=body)
        done.append(response.json())
        if len(done) % 10 == 0 or len(done) == args.jobs:
            print(f"\r  {len(done)}/{args.jobs} trajectories", end="", flush=True)

    async with httpx.AsyncClient(timeout=600, trust_env=False, headers=auth_headers()) as http:
        await asyncio.gather(*(one(http, i) for i in range(args.jobs)))
    print()
    return done


def check_fidelity(results: list[dict[str, Any]], sampled: list[dict[str, Any]]) -> dict[str, Any]:
    """Part 1: every mask-1 token against the engine's record of the request that produced it (the same
    prompt ids and seed: the handler seeds turn t of job i with i * 100 + t)."""
    by_request = {(tuple(r["prompt_ids"]), r["seed"]): r for r in sampled}
    turns = tokens = matching = unmatched = 0
    for result in results:
        traj = result["trajectory"]
        stream = traj["prompt_ids"] + traj["response_ids"]
        offset = len(traj["prompt_ids"])
        job_index = int(result["job_id"].removeprefix("fidelity-"))
        for index, turn in enumerate(traj["turns"]):
            turns += 1
            start = turn["prompt_len"] - offset  # where this turn's ids sit in response_ids
            returned = traj["response_ids"][start : start + len(turn["output_ids"])]
            logprobs = traj["response_logprobs"][start : start + len(turn["output_ids"])]
            assert all(m == 1 for m in traj["response_mask"][start : start + len(returned)])
            record = by_request.get((tuple(stream[: turn["prompt_len"]]), job_index * 100 + index))
            tokens += len(returned)
            if record is None:
                unmatched += 1
                continue
            matching += (
                sum(
                    1
                    for got, lp, want, want_lp in zip(
                        returned, logprobs, record["output_ids"], record["logprobs"], strict=False
                    )
                    if got == want and lp == want_lp
                )
                if len(returned) == len(record["output_ids"])
                else 0
            )
    return {
        "turns": turns,
        "model_tokens": tokens,
        "tokens_matching": matching,
        "share_matching": matching / tokens if tokens else None,
        "turns_unmatched": unmatched,
    }


async def check_reencode(llm: str, results: list[dict[str, Any]], eos_ids: set[int]) -> dict[str, Any]:
    """Part 2: re-encode each turn's text and compare with what was sampled."""
    root = llm.removesuffix("/v1")
    changed_trajectories = changed_turns = changed_tokens = 0
    async with httpx.AsyncClient(timeout=60, trust_env=False) as http:
        for result in results:
            changed = False
            for turn in result["trajectory"]["turns"]:
                sampled = [t for t in turn["output_ids"] if t not in eos_ids]
                response = await http.post(
                    f"{root}/tokenize", json={"prompt": turn["text"], "add_special_tokens": False}
                )
                again = response.json()["tokens"]
                if again != sampled:
                    changed = True
                    changed_turns += 1
                    same = sum(1 for a, b in zip(again, sampled, strict=False) if a == b)
                    changed_tokens += max(len(again), len(sampled)) - same
            changed_trajectories += changed
    n = len(results)
    return {
        "trajectories": n,
        "trajectories_changed": changed_trajectories,
        "share_changed": changed_trajectories / n if n else None,
        "turns_changed": changed_turns,
        "tokens_changed": changed_tokens,
    }


def end_of_turn_ids(llm: str) -> set[int]:
    """Ids of the chat template's end-of-turn markers (never part of a turn's text)."""
    root = llm.removesuffix("/v1")
    with httpx.Client(timeout=30, trust_env=False) as http:
        ids = http.post(f"{root}/tokenize", json={"prompt": "<|im_end|><|endoftext|>", "add_special_tokens": False})
    return set(ids.json()["tokens"])


def choose_engine() -> tuple[str, str]:
    """The default `--engine`: vLLM when its CPU build is installed and this machine can run it, else the dev
    engine; returns (kind, why)."""
    install = VllmCpuInstall.default()
    problem = unsupported_reason() or install.missing()
    if problem:
        return "dev", f"the real vLLM cannot run here: {problem}"
    return "vllm", f"the vLLM CPU build is installed under {install.home}"


def engine_records(generations: list[RecordedGeneration]) -> list[dict[str, Any]]:
    """The proxy's recorded completions in the shape of the dev engine's `/debug/sampled` records (prompt
    ids and seed of the request; ids and logprobs of `choices[0]` of the answer)."""
    return [
        {"prompt_ids": g.prompt_ids, "seed": g.seed, "output_ids": g.output_ids, "logprobs": g.logprobs}
        for g in generations
    ]


def server_options(llm: str, args: argparse.Namespace) -> list[str]:
    """`prorl-server serve` options: the engine (or the proxy in front of it) and the follow-up handler."""
    return [
        "--llm-server", llm, "--handler", f"followup={HANDLER_FILE}:FollowUpHandler",
        "--no-entry-points", "--runtime", "local", "--run-workers", str(args.concurrency), "--log-level", "warning",
    ]  # fmt: skip


def run_and_time(server: str, args: argparse.Namespace) -> tuple[list[dict[str, Any]], float]:
    """The jobs' results and the wall time they took."""
    print(f"running {args.jobs} chats of {args.turns} turns (max_tokens {args.max_tokens}, temperature 1)")
    started = time.monotonic()
    results = asyncio.run(run_jobs(server, args))
    return results, time.monotonic() - started


def measure(args: argparse.Namespace, logs: Path) -> dict[str, Any]:
    """Start the stack, run the jobs, compare; returns the figures."""
    with LocalStack(logs) as stack:
        failed_requests = 0
        if args.engine == "dev":
            print("starting the dev engine (SmolLM2-135M, 2 slots) and prorl-server ...", flush=True)
            started = time.monotonic()
            llm = stack.dev_llm("--slots", "2", "--debug-sampled", str(args.jobs * args.turns + 100))
            start_s = time.monotonic() - started
            server = stack.server(*server_options(llm, args))
            results, wall = run_and_time(server, args)
            with httpx.Client(timeout=60, trust_env=False) as http:
                sampled = http.get(f"{llm.removesuffix('/v1')}/debug/sampled").json()
        else:
            print(
                f"starting vLLM {VLLM_VERSION} (CPU build, {SERVED_MODEL_NAME}, max_num_seqs {args.concurrency}),"
                " a recording proxy and prorl-server ...",
                flush=True,
            )
            started = time.monotonic()
            llm = stack.vllm(VllmCpuSettings(max_num_seqs=args.concurrency))
            start_s = time.monotonic() - started
            print(f"  vLLM healthy after {start_s:.1f} s", flush=True)
            proxy = RecordingProxy(llm.removesuffix("/v1"))
            with UvicornThread(proxy.app()) as proxy_server:
                server = stack.server(*server_options(f"{proxy_server.url}/v1", args))
                results, wall = run_and_time(server, args)
            sampled, failed_requests = engine_records(proxy.generations()), proxy.unrecorded
        completed = [r for r in results if r.get("status") == "completed"]
        fidelity = check_fidelity(completed, sampled)
        reencode = asyncio.run(check_reencode(llm, completed, end_of_turn_ids(llm)))
    generated = fidelity["model_tokens"]
    engine = {
        "kind": args.engine,
        "generated_tokens": generated,
        "wall_s": round(wall, 1),
        "tokens_per_s": round(generated / wall, 1),
        "start_s": round(start_s, 1),
        "requests_recorded": len(sampled),
        "requests_failed": failed_requests,
    }
    return {
        "jobs": {"completed": len(completed), "failed": len(results) - len(completed)},
        "fidelity": fidelity,
        "reencode": reencode,
        "engine": engine,
    }


def build_checks(report: dict[str, Any]) -> list[dict[str, Any]]:
    """Part 1's target; part 2 is the baseline it is compared with."""
    fidelity, reencode = report["fidelity"], report["reencode"]
    share = fidelity["share_matching"]
    return [
        check(
            f"model tokens returned exactly as {ENGINE_NAMES[report['engine']['kind']]} sampled them (id and logprob)",
            f"{100 * share:.2f}% of {fidelity['model_tokens']}" if share is not None else None,
            f"re-encoding changes {reencode['trajectories_changed']}/{reencode['trajectories']} trajectories",
            "100%",
            share == 1.0 and fidelity["turns_unmatched"] == 0,
        )
    ]


def print_report(report: dict[str, Any]) -> None:
    """Human-readable tables."""
    if "fidelity" in report:
        f, r, e = report["fidelity"], report["reencode"], report["engine"]
        name = ENGINE_NAMES[e["kind"]]
        source = "GET /debug/sampled" if e["kind"] == "dev" else "recorded /v1/completions answers"
        print(f"\nReturned vs sampled (part 1, {name}; engine's record: {source})")
        print(f"  {'turns':<34}{f['turns']:>10}")
        print(f"  {'model tokens':<34}{f['model_tokens']:>10}")
        print(f"  {'equal id and logprob':<34}{f['tokens_matching']:>10}")
        print(f"  {'turns without an engine record':<34}{f['turns_unmatched']:>10}")
        print(f"\nDecode-then-re-encode (part 2, {name}'s tokenizer)")
        print(f"  {'trajectories':<34}{r['trajectories']:>10}")
        print(f"  {'trajectories changed':<34}{r['trajectories_changed']:>10}")
        print(f"  {'turns changed':<34}{r['turns_changed']:>10}")
        print(f"  {'tokens changed':<34}{r['tokens_changed']:>10}")
        if e["kind"] == "dev":
            engine = "dev engine (SmolLM2-135M, 2 slots)"
        else:
            engine = f"vLLM {VLLM_VERSION} CPU ({SERVED_MODEL_NAME}, max_num_seqs {report['config']['concurrency']})"
        print(f"\nEngine: {engine}")
        print(f"  {'start to healthy':<34}{e['start_s']:>9.1f}s")
        print(f"  {'generated tokens':<34}{e['generated_tokens']:>10}")
        print(f"  {'wall time of the jobs':<34}{e['wall_s']:>9.1f}s")
        print(f"  {'tokens/s':<34}{e['tokens_per_s']:>10}")
        print(f"  {'completion requests recorded':<34}{e['requests_recorded']:>10}")
        if e["requests_failed"]:
            print(f"  {'recorded requests that failed':<34}{e['requests_failed']:>10}")
        jobs = report["jobs"]
        if jobs["failed"]:
            print(f"\nWARNING: {jobs['failed']} of {jobs['completed'] + jobs['failed']} jobs did not complete")
    print_checks(report.get("checks", []))


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark, print the tables, optionally write JSON."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", type=Path, help="write the figures to this file")
    parser.add_argument(
        "--engine",
        choices=["dev", "vllm"],
        help="the engine: the dev engine, or the real vLLM (CPU build) behind a recording proxy "
        "(default: vllm when scripts/setup-vllm.sh installed it, else dev)",
    )
    parser.add_argument("--jobs", type=positive_int, default=200, help="trajectories")
    parser.add_argument("--turns", type=positive_int, default=2, help="assistant turns per trajectory")
    parser.add_argument(
        "--max-tokens",
        type=positive_int,
        help=f"max_tokens of each turn (default {ENGINE_DEFAULTS['dev']['max_tokens']} with the dev engine, "
        f"{ENGINE_DEFAULTS['vllm']['max_tokens']} with vLLM)",
    )
    parser.add_argument(
        "--concurrency",
        type=positive_int,
        help=f"jobs in flight, and vLLM's max_num_seqs (default {ENGINE_DEFAULTS['dev']['concurrency']} with "
        f"the dev engine, {ENGINE_DEFAULTS['vllm']['concurrency']} with vLLM)",
    )
    args = parser.parse_args(argv)
    if args.engine is None:
        args.engine, why = choose_engine()
        print(f"engine: {args.engine} ({why}; --engine chooses)")
    for key, value in ENGINE_DEFAULTS[args.engine].items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    started = time.monotonic()
    report: dict[str, Any] = report_header(args)
    failures: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="bench-fidelity-") as tmp:
        try:
            report.update(measure(args, Path(tmp)))
            report["checks"] = build_checks(report)
        except Exception as exc:  # a part that cannot run at all
            failures["fidelity"] = f"{type(exc).__name__}: {exc}"
    report["elapsed_s"] = time.monotonic() - started
    print_report(report)
    return finish(report, failures, args.json, None)


if __name__ == "__main__":
    sys.exit(main())

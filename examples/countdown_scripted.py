"""Countdown with a scripted LLM test double: a prorl-server, 16 multi-turn jobs, rewards per group.

Run it with the project's Python: `python examples/countdown_scripted.py`. It starts two processes and stops both
when it ends (also on Ctrl-C, SIGTERM or an error):

1. `python -m prorl_server.testing`: a SCRIPTED TEST DOUBLE speaking vLLM's HTTP protocol.
   It is not an LLM: it answers with the replies this script queues on its `POST /script`, in order.
2. `prorl-server serve` with the example Countdown handler loaded from its file
   (examples/custom_handler/src/prorl_example_handlers/countdown.py).

Each job gets its own script (`POST /script {"job": job_id, "replies": [...]}`): prorl-server names the job in
every completion request, so a job receives its own replies however the server's workers interleave the jobs,
and the outcome is the same on every run.
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from prorl_server.launch import LocalStack, auth_headers, free_port, run_with_stack

HERE = Path(__file__).resolve().parent
HANDLER_FILE = HERE / "custom_handler" / "src" / "prorl_example_handlers" / "countdown.py"
MAX_TURNS = 3
TERMINAL = {"completed", "failed", "timeout", "cancelled"}

# Each puzzle with a right answer (S), one too high (H) and one too low (L); X is a reply without <answer>.
PUZZLES: list[dict[str, Any]] = [
    {"numbers": [3, 5, 4, 2], "target": 24, "S": "(5 + 3 - 2) * 4", "H": "5 * 4 + 3 * 2", "L": "3 * 5 + 4 * 2"},
    {"numbers": [6, 7, 9], "target": 51, "S": "6 * 7 + 9", "H": "6 * 9 + 7", "L": "9 * 6 - 7"},
    {"numbers": [2, 8, 10, 25], "target": 52, "S": "25 * 2 + 10 - 8", "H": "25 * 2 + 10", "L": "8 * 2 + 25 + 10"},
    {"numbers": [1, 3, 7, 11], "target": 100, "S": "(11 - 1) * (7 + 3)", "H": "11 * (7 + 3) + 1", "L": "11 * 7 + 3"},
]
# What "the model" answers turn by turn in each of the 4 samples of each puzzle (solved iff it ends in S).
PLANS = [["S", "HS", "LS", "XS"], ["S", "HLH", "LHS", "HS"], ["HLS", "XLL", "LLH", "S"], ["HHH", "XXX", "LHL", "HLX"]]


def reply_text(puzzle: dict[str, Any], move: str) -> str:
    """The scripted model output for one move of a plan."""
    if move == "X":
        return f"I am fairly sure it is {puzzle['target']}."
    return f"Let me try this. <answer>{puzzle[move]}</answer>"


def run_demo(stack: LocalStack) -> int:
    """Start both processes, script the replies, run 16 jobs, print results; returns the exit code."""
    double_port = free_port()
    double = f"http://127.0.0.1:{double_port}"
    print(f"[1/4] starting the SCRIPTED TEST DOUBLE on {double} (not a real LLM: it replays queued replies)")
    stack.launch("scripted_backend", [sys.executable, "-m", "prorl_server.testing", "--port", str(double_port),
                                      "--delay", "0.05"], f"{double}/health")  # fmt: skip
    print(f"[2/4] starting prorl-server with handler countdown={HANDLER_FILE.name}:CountdownHandler")
    server = stack.server("--llm-server", f"{double}/v1", "--handler", f"countdown={HANDLER_FILE}:CountdownHandler",
                          "--no-entry-points", "--log-level", "warning")  # fmt: skip

    jobs: dict[str, tuple[int, str]] = {}  # job_id -> (puzzle index, plan)
    scripts: dict[str, list[dict[str, str]]] = {}  # job_id -> the replies of its turns, in order
    for p, puzzle in enumerate(PUZZLES):
        for s, plan in enumerate(PLANS[p]):
            assert len(plan) <= MAX_TURNS and ("S" not in plan or plan.index("S") == len(plan) - 1)
            assert len(plan) == MAX_TURNS or plan.endswith("S"), "a plan must use every turn it is given"
            jobs[f"puzzle{p}-sample{s}"] = (p, plan)
            scripts[f"puzzle{p}-sample{s}"] = [{"text": reply_text(puzzle, move)} for move in plan]
    # loopback only: ignore proxy settings; send the server's key ($PRORL_API_KEY when set, which the server
    # inherits, else the key in the user's key file, which the server made if it had to)
    with httpx.Client(timeout=30.0, trust_env=False, headers=auth_headers()) as http:
        for job_id, replies in scripts.items():  # before the job is submitted: its first turn finds them
            queued = http.post(f"{double}/script", json={"job": job_id, "replies": replies}).raise_for_status()
            if queued.json()["queued"] != len(replies):
                raise RuntimeError(f"the double already held replies for {job_id}: {queued.json()}")
        total = sum(len(r) for r in scripts.values())
        print(f"[3/4] queued {total} scripted replies, each job its own; submitting {len(jobs)} jobs "
              "(4 puzzles x 4 samples)")  # fmt: skip
        for job_id, (p, _) in jobs.items():
            instance = {"data_source": "countdown", "numbers": PUZZLES[p]["numbers"], "target": PUZZLES[p]["target"]}
            body = {"job_id": job_id, "instance": instance, "timeout": 60,
                    "sampling_params": {"temperature": 1.0, "max_tokens": 64, "max_turns": MAX_TURNS}}  # fmt: skip
            response = http.post(f"{server}/jobs", json=body)
            if response.status_code != 202:
                raise RuntimeError(f"POST /jobs answered {response.status_code}: {response.text}")

        print("[4/4] streaming results (GET /jobs long-poll, then POST /jobs/ack)")
        results: dict[str, dict[str, Any]] = {}
        cursor, deadline = 0, time.monotonic() + 120
        while len(results) < len(jobs) and time.monotonic() < deadline:
            response = http.get(f"{server}/jobs", params={"after": cursor, "limit": 100, "wait": 5}, timeout=35)
            page = response.raise_for_status().json()
            for result in page["results"]:
                if result["job_id"] not in jobs:
                    continue
                results[result["job_id"]] = result
                traj = result["trajectory"]
                model_tokens = sum(traj["response_mask"])
                print(f"  [{len(results):2d}/{len(jobs)}] {result['job_id']:<16} {result['status']:<9} "
                      f"reward={result['reward']} turns={len(traj['turns'])} prompt_tokens={len(traj['prompt_ids'])} "
                      f"response_tokens={len(traj['response_ids'])} (model {model_tokens})")  # fmt: skip
                if result["error"]:
                    print(f"      error: {result['error']}")
            cursor = page["next_cursor"]
            if page["results"]:
                http.post(f"{server}/jobs/ack", json={"through": cursor}).raise_for_status()

    print("\nreward per group (GRPO-style advantages need variance > 0 within a group):")
    for p in range(len(PUZZLES)):
        rewards = [results[j]["reward"] or 0.0 for j, (q, _) in jobs.items() if q == p and j in results]
        if rewards:
            mean, var = statistics.fmean(rewards), statistics.pvariance(rewards)
            print(f"  puzzle{p} target={PUZZLES[p]['target']:<4} rewards={rewards} mean={mean:.2f} variance={var:.4f}")
    expected = {j: 1.0 if plan.endswith("S") else 0.0 for j, (_, plan) in jobs.items()}
    mismatched = [j for j, r in expected.items() if results.get(j, {}).get("reward") != r]
    print(f"rewards differing from the script's plan: {mismatched or 'none'}")
    print("(the 'model' was the scripted test double replaying queued replies, not an LLM)")
    unfinished = [j for j in jobs if results.get(j, {}).get("status") not in TERMINAL]
    if unfinished:
        print(f"ERROR: {len(unfinished)} job(s) did not reach a terminal status: {unfinished}")
        return 1
    if mismatched:
        print(f"ERROR: {len(mismatched)} reward(s) differ from the script's plan")
        return 1
    return 0


def main() -> int:
    """Run the demo; whatever happens, stop both child processes (by PID)."""
    return run_with_stack("prorl-countdown-", run_demo)


if __name__ == "__main__":
    sys.exit(main())

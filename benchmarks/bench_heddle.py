"""Benchmark: Heddle in the oversubscribed regime, homogeneous and heterogeneous workers (simulated time).

Run it from the repository root::

    .venv/bin/python benchmarks/bench_heddle.py [--json out.json] [--workers 8] [--per-worker 100]
        [--samples 8] [--profile examples/profiles/vllm-cpu-smollm2-135m.json] [--max-num-seqs 128]
        [--degrees 1,2,4,8] [--efficiency 0.8] [--allocation 4,1,1,1,1] [--resolve-fraction 0.25] [--seed 0]

A few seconds on 2 cores with the defaults. Every figure is SIMULATED: `rollout_sim.py` runs the
rollout as a discrete-event simulation in simulated seconds (the timing model of `sim-llm`, without HTTP or
a server), with the server's own `TrajectoryPlacer` and online length predictor for the trajectory-aware
configurations. What is measured is the profile it is fed, not the rollout.

The trace: a long-tail coding workload, `--per-worker` trajectories per worker (Heddle's 100), prompts of
`--samples` samples each (a GRPO group); per prompt a lasting scale of turns and of tokens per turn (the
predictor's signal), per sample lognormal turns (median 6, at most 40) and tokens per turn (median 150, at
most 8,000), tool time after each turn lognormal around 0.5 s (Heddle's table 1), an observation of about
150 tokens appended after each turn, a 600-token prompt. A warm-up epoch of the same prompts (other samples)
teaches the predictor first (only its finished trajectories, not simulated).

The interference profile: `--profile` (a profile file, default the vLLM CPU build's measured here, whose
points end at batch 16 and are extended linearly past it, with its measured prefill cost per token), each
worker running at most `--max-num-seqs` requests (degree d: d times as many). Heterogeneous workers: degree
d from `parallel_profile` (per-token time / (d x efficiency^log2 d): an assumed scaling); the degrees spend
the same GPU budget as the homogeneous set (`--workers` GPUs), chosen by Heddle's sort-initialised
simulated annealing (`anneal_allocation`) on the predicted lengths at submission.

Configurations:

- `verl-like`: round-robin dispatch (each call in arrival order) and least-load placement as SGLang's router
  and Heddle's section 7.3 baseline: each call to the worker holding its prefix unless the loads are skewed
  (more than 32 requests and 1.5x between the most and least loaded), then to the least loaded; homogeneous;
- `slime-like`: the same dispatch, cache-affine placement (each call to the worker holding its prefix);
  homogeneous;
- `heddle`: progressive priority, presorted-DP placement with migration (`TrajectoryPlacer`); homogeneous;
- `heddle-hetero`: the same on the annealed heterogeneous workers.

Figures: makespan (simulated s), rollout throughput (output tokens / simulated s, Heddle's metric), speed-up
over verl-like, the prefix-cache hit rate, calls moved between workers, and the lower bound of each worker
set::

    alone(t)    = its output tokens x I_fastest(1) + its tool time + its prompt and observations x prefill
    capacity_w  = max over n <= batch limit of n / I_w(n)   (a worker's decode tokens per second)
    work        = (total output tokens + prefill x min_w capacity_w x total prompt and observation tokens)
                  / sum_w capacity_w
    lower bound = max(max over t of alone(t), work)

(work: worker w is busy at least its output tokens / capacity_w plus its prefill tokens x prefill; weighting
each worker's inequality by capacity_w and summing gives it.)

No policy can beat verl-like by more than verl-like's makespan / the lower bound (printed as "at most").
Targets (issue 26; checks, not assertions): heddle >= 1.5x verl-like's throughput on homogeneous workers,
heddle-hetero >= 2x.

JSON output (`--json PATH`)::

    {
      "machine": {"cpus", "python", "load_avg_1m_at_start"}, "config": {every command-line option},
      "simulated": true,
      "trace": {"trajectories", "prompts", "turns_total", "output_tokens", "longest_tokens", "median_tokens"},
      "profile": {"file", "points", "prefill_s_per_token", "max_num_seqs"},
      "allocation": {"degrees", "dp_solves", "predicted_makespan_s", "annealed" (false with --allocation)},
      "bounds": {"homogeneous" | "heterogeneous": {"longest_alone_s", "capacity_tok_s", "work_bound_s",
                                                    "lower_bound_s"}},
      "configs": {label: {"workers", "makespan_s", "throughput_tok_s", "speedup", "cache_hit_rate",
                          "moves", "vs_lower_bound", "wall_s"}},
      "checks": [{"metric", "value", "baseline", "target", "pass"}],
      "elapsed_s"
    }

Exit code 0 whatever the figures; 1 only if a part could not run at all.
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from _report import check, finish, positive_int, print_checks, report_header
from rollout_sim import ClairvoyantPolicy, HeddlePolicy, Plan, RouterPolicy, Worker, simulate

from prorl_server.scheduling.heterogeneous import anneal_allocation, parallel_profile, place_on_workers
from prorl_server.scheduling.placement_runtime import RESOLVE_FRACTION
from prorl_server.scheduling.predictor import make_predictor
from prorl_server.scheduling.profile import Profile
from prorl_server.scheduling.profile_file import read_profile_file
from prorl_server.scheduling.view import TrajectoryView

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_PROFILE_FILE = ROOT / "examples" / "profiles" / "vllm-cpu-smollm2-135m.json"
PROMPT_LEN = 600


def draw_plans(prompts: int, samples: int, seed: int, epoch: str) -> list[Plan]:
    """The long-tail coding trace (module docstring): the same prompts in every epoch, other samples."""
    plans = []
    for p in range(prompts):
        lasting = random.Random(f"{seed}:prompt:{p}")
        turn_scale, token_scale = lasting.lognormvariate(0, 0.6), lasting.lognormvariate(0, 1.0)
        rng = random.Random(f"{seed}:{epoch}:{p}")
        for s in range(samples):
            turns = max(1, min(40, round(rng.lognormvariate(math.log(6 * turn_scale), 0.3))))
            mu = math.log(150 * token_scale)
            tokens = tuple(max(1, min(8000, round(rng.lognormvariate(mu, 0.5)))) for _ in range(turns))
            plans.append(
                Plan(
                    key=f"{epoch}-{p}-{s}",
                    data_source="coding",
                    prompt_key=f"prompt-{p}",
                    prompt_len=PROMPT_LEN,
                    tokens=tokens,
                    tool_s=tuple(rng.lognormvariate(math.log(0.5), 0.5) for _ in range(turns - 1)),
                    observations=tuple(max(1, round(rng.lognormvariate(math.log(150), 0.5))) for _ in range(turns - 1)),
                )
            )
    return plans


def final_view(plan: Plan) -> TrajectoryView:
    return TrajectoryView(
        data_source=plan.data_source,
        prompt_key=plan.prompt_key,
        prompt_len=plan.prompt_len,
        turns=len(plan.tokens),
        model_tokens=plan.output_tokens,
        observation_tokens=sum(plan.observations),
        finished=True,
    )


def warm_predictor(warmup: list[Plan]):
    """The online predictor after learning the warm-up epoch's finished trajectories."""
    predictor = make_predictor("online")
    for plan in warmup:
        predictor.observe_finished(final_view(plan))
    return predictor


def bounds(plans: list[Plan], profiles: list[Profile], prefill: float) -> dict[str, float]:
    """The lower bound of the makespan on these workers (module docstring)."""
    fastest = min(p.seconds_per_token(1) for p in profiles)
    alone = max(
        plan.output_tokens * fastest + sum(plan.tool_s) + prefill * (plan.prompt_len + sum(plan.observations))
        for plan in plans
    )
    capacities = [max(n / p.seconds_per_token(n) for n in range(1, (p.batch_limit or 1) + 1)) for p in profiles]
    capacity = sum(capacities)
    prefilled = sum(plan.prompt_len + sum(plan.observations) for plan in plans)  # each at least once
    work = (sum(plan.output_tokens for plan in plans) + prefill * min(capacities) * prefilled) / capacity
    return {
        "longest_alone_s": alone,
        "capacity_tok_s": capacity,
        "work_bound_s": work,
        "lower_bound_s": max(alone, work),
    }


def workers_of(profiles: list[Profile], prefill: float) -> list[Worker]:
    return [Worker(profile, prefill) for profile in profiles]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", type=Path, help="write the figures to this file")
    parser.add_argument("--workers", type=positive_int, default=8, help="degree-1 workers = the GPU budget")
    parser.add_argument("--per-worker", type=positive_int, default=100, help="trajectories per worker")
    parser.add_argument("--samples", type=positive_int, default=8, help="samples per prompt")
    parser.add_argument("--profile", type=Path, default=DEFAULT_PROFILE_FILE, help="a profile file")
    parser.add_argument("--max-num-seqs", type=positive_int, default=128, help="batch limit of a degree-1 worker")
    parser.add_argument("--degrees", default="1,2,4,8", help="model-parallel degrees the annealing may choose")
    parser.add_argument("--efficiency", type=float, default=0.8, help="speed-up kept per doubling of the degree")
    parser.add_argument(
        "--allocation",
        default="",
        help="heterogeneous degrees to use instead of annealing them, comma-separated (e.g. 4,1,1,1,1)",
    )
    parser.add_argument(
        "--resolve-fraction",
        type=float,
        default=RESOLVE_FRACTION,
        help="the placer solves the DP again after this share of the live count arrived (0: at every arrival)",
    )
    parser.add_argument(
        "--clairvoyant",
        action="store_true",
        help="also run heddle and heddle-hetero with exact predictions (a reference, not a policy)",
    )
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    started = time.monotonic()
    report: dict[str, Any] = report_header(args)
    report["simulated"] = True
    failures: dict[str, str] = {}
    try:
        measured = read_profile_file(args.profile)
        degrees = sorted({int(d) for d in args.degrees.split(",") if d.strip()})
        if not degrees or degrees[0] < 1 or not 0 < args.efficiency <= 1:
            raise ValueError("--degrees must be positive integers and --efficiency in (0, 1]")
    except ValueError as exc:
        parser.error(str(exc))
    prefill = measured.prefill_s_per_token or 0.0
    base = measured.profile()
    limit = args.max_num_seqs
    homogeneous = [base.with_batch_limit(limit)] * args.workers
    prompts = max(1, args.workers * args.per_worker // args.samples)
    warmup = draw_plans(prompts, args.samples, args.seed, "warmup")
    plans = draw_plans(prompts, args.samples, args.seed, "measured")
    lengths = sorted(p.output_tokens for p in plans)
    report["trace"] = {
        "trajectories": len(plans),
        "prompts": prompts,
        "turns_total": sum(len(p.tokens) for p in plans),
        "output_tokens": sum(lengths),
        "longest_tokens": lengths[-1],
        "median_tokens": statistics.median(lengths),
    }
    report["profile"] = {
        "file": str(args.profile),
        "points": measured.points,
        "prefill_s_per_token": prefill,
        "max_num_seqs": limit,
    }
    predictor = warm_predictor(warmup)
    predicted = [
        predictor.predict(TrajectoryView("coding", p.prompt_key, p.prompt_len)).remaining_tokens for p in plans
    ]
    by_degree = {d: parallel_profile(base, d, args.efficiency, limit * d) for d in degrees if d <= args.workers}
    if args.allocation:
        chosen = tuple(sorted((int(d) for d in args.allocation.split(",") if d.strip()), reverse=True))
        if not chosen or chosen[-1] < 1:
            parser.error("--allocation takes positive degrees")
        by_degree.update({d: parallel_profile(base, d, args.efficiency, limit * d) for d in chosen})
        placed = place_on_workers(predicted, [by_degree[d] for d in chosen])
        report["allocation"] = {"degrees": list(chosen), "dp_solves": 1, "predicted_makespan_s": placed.makespan}
    else:
        allocation = anneal_allocation(predicted, args.workers, by_degree, seed=args.seed)
        report["allocation"] = {
            "degrees": list(allocation.degrees),
            "dp_solves": allocation.evaluated,
            "predicted_makespan_s": allocation.placement.makespan,
        }
    report["allocation"]["annealed"] = not args.allocation
    heterogeneous = [by_degree[d] for d in report["allocation"]["degrees"]]
    report["bounds"] = {
        "homogeneous": bounds(plans, homogeneous, prefill),
        "heterogeneous": bounds(plans, heterogeneous, prefill),
    }
    history = [final_view(plan) for plan in warmup]  # what the placer learns its observations per turn from
    configs = {
        "verl-like": (homogeneous, lambda w: RouterPolicy("verl-like", cache_affine=False)),
        "slime-like": (homogeneous, lambda w: RouterPolicy("slime-like", cache_affine=True)),
        "heddle": (
            homogeneous,
            lambda w: HeddlePolicy(warm_predictor(warmup), w, prefill, args.resolve_fraction, history),
        ),
        "heddle-hetero": (
            heterogeneous,
            lambda w: HeddlePolicy(warm_predictor(warmup), w, prefill, args.resolve_fraction, history),
        ),
    }
    if args.clairvoyant:
        configs["heddle-clairvoyant"] = (
            homogeneous,
            lambda w: ClairvoyantPolicy(w, prefill, resolve_fraction=args.resolve_fraction, history=history),
        )
        configs["hetero-clairvoyant"] = (
            heterogeneous,
            lambda w: ClairvoyantPolicy(w, prefill, resolve_fraction=args.resolve_fraction, history=history),
        )
    report["configs"] = {}
    for label, (profiles, make) in configs.items():
        t0 = time.monotonic()
        try:
            workers = workers_of(profiles, prefill)
            outcome = simulate(plans, workers, make(workers))
        except Exception as exc:  # a part that cannot run at all
            failures[label] = f"{type(exc).__name__}: {exc}"
            continue
        kind = "heterogeneous" if profiles is heterogeneous else "homogeneous"
        report["configs"][label] = {
            "workers": kind,
            "makespan_s": outcome.makespan_s,
            "throughput_tok_s": outcome.throughput_tok_s,
            "cache_hit_rate": outcome.cache_hit_rate,
            "moves": outcome.migrations,
            "vs_lower_bound": outcome.makespan_s / report["bounds"][kind]["lower_bound_s"],
            "wall_s": time.monotonic() - t0,
        }
        print(f"  {label}: makespan {outcome.makespan_s:.0f} sim s ({time.monotonic() - t0:.1f} s wall)", flush=True)
    base_run = report["configs"].get("verl-like")
    for figures in report["configs"].values():
        figures["speedup"] = figures["throughput_tok_s"] / base_run["throughput_tok_s"] if base_run else None
    print_report(report)
    report["checks"] = build_checks(report)
    report["elapsed_s"] = time.monotonic() - started
    print_checks(report["checks"])
    return finish(report, failures, args.json, None)


def print_report(report: dict[str, Any]) -> None:
    trace, alloc = report["trace"], report["allocation"]
    print(
        f"\nSIMULATED rollout: {trace['trajectories']} trajectories ({trace['prompts']} prompts), "
        f"{trace['turns_total']} turns, {trace['output_tokens']} output tokens (median {trace['median_tokens']:.0f}, "
        f"longest {trace['longest_tokens']}); profile {report['profile']['file']}"
    )
    how = f"annealed, {alloc['dp_solves']} DP solves" if alloc["annealed"] else "given by --allocation"
    print(f"heterogeneous workers ({how}): degrees {alloc['degrees']}")
    for kind, b in report["bounds"].items():
        print(
            f"lower bound, {kind}: {b['lower_bound_s']:.0f} s = max(longest alone {b['longest_alone_s']:.0f} s, "
            f"work with prefill {b['work_bound_s']:.0f} s)"
        )
    rows = [
        ("workers", "workers", None),
        ("makespan (sim s)", "makespan_s", 0),
        ("throughput (tok / sim s)", "throughput_tok_s", 1),
        ("  x verl-like", "speedup", 2),
        ("  makespan / lower bound", "vs_lower_bound", 2),
        ("prefix-cache hit rate", "cache_hit_rate", 3),
        ("calls moved between workers", "moves", None),
    ]
    labels = list(report["configs"])
    width = max(len(r[0]) for r in rows)
    widths = [max(len(label), 13) for label in labels]
    print("  " + "figure".ljust(width) + "  " + "  ".join(x.ljust(w) for x, w in zip(labels, widths, strict=True)))
    for title, key, digits in rows:
        cells = []
        for label in labels:
            value = report["configs"][label][key]
            cells.append(f"{value:.{digits}f}" if digits is not None and value is not None else str(value))
        print("  " + title.ljust(width) + "  " + "  ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)))


def build_checks(report: dict[str, Any]) -> list[dict[str, Any]]:
    configs, rows = report["configs"], []
    base = configs.get("verl-like")
    if not base:
        return rows
    for label, target, kind in (("heddle", 1.5, "homogeneous"), ("heddle-hetero", 2.0, "heterogeneous")):
        figures = configs.get(label)
        if not figures:
            continue
        possible = base["makespan_s"] / report["bounds"][kind]["lower_bound_s"]
        rows.append(
            check(
                f"{label}: throughput vs verl-like ({kind})",
                f"{figures['throughput_tok_s']:.1f} tok/s ({figures['speedup']:.2f}x)",
                f"verl-like {base['throughput_tok_s']:.1f} tok/s (at most {possible:.2f}x possible)",
                f">= {target}x",
                figures["speedup"] >= target,
            )
        )
    return rows


if __name__ == "__main__":
    sys.exit(main())

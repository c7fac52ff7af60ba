"""Benchmark: accuracy of the progressive length predictor against baselines, on a seeded synthetic trace.

Run it from the repository root::

    .venv/bin/python benchmarks/bench_predictor.py [--json out.json] [--seed 0] [--prompts 96] [--samples 8]
        [--epochs 6] [--warmup 2] [--fraction 0.1]

A second or two. The trace is `prorl_server.scheduling.synthetic.synthetic_trace`: `--prompts` prompts over
three data sources of different scales, each prompt with its own lasting scale, `--samples` trajectories per
prompt per epoch (a GRPO group), `--epochs` epochs. Each predictor replays the epochs in order
(`prorl_server.scheduling.replay`): it learns every epoch's finished trajectories, and each epoch after the
first `--warmup` is scored before it is learnt, as Heddle reports it (section 7.2): after step k (k turns
done; a trajectory that ended sooner counts with its final view), the recall of the true top `--fraction`
longest (total response tokens) among the predicted top `--fraction`, and Pearson's r between predicted and
true totals. Figures are means over the scored epochs. Predictors, by their registry names:

- online: the default progressive predictor (per-prompt, prompt-length, data-source and global histories of
  final lengths, conditioned on what the trajectory already has, paced by its own tokens per turn);
- source_mean: the baseline, the data source's mean final length minus what the trajectory already has;
- none: no prediction, so the predicted total is the tokens so far (shown for reference).

JSON output (`--json PATH`)::

    {
      "machine": {"cpus", "python", "load_avg_1m_at_start"},
      "config": {every command-line option},
      "trace": {"trajectories_per_epoch", "epochs", "scored_epochs", "mean_tokens", "p90_tokens",
                "max_tokens", "mean_turns"},                 # over the scored epochs
      "predictors": {
        "online" | "source_mean" | "none": {
          "step_1" | "step_2": {"recall", "pearson",        # means over the scored epochs
                                "recall_per_epoch", "pearson_per_epoch"}   # Pearson null when undefined
        }
      },
      "checks": [{"metric", "value", "baseline", "target", "pass"}],
      "failures": {part: error message},                     # parts that could not run (normally empty)
      "elapsed_s"
    }

Exit code 0 whatever the figures; 1 only if a part could not run at all.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from _report import check, finish, positive_int, print_checks, report_header

from prorl_server.scheduling import make_predictor, replay
from prorl_server.scheduling.synthetic import synthetic_trace

PREDICTORS = ("online", "source_mean", "none")
STEPS = (1, 2)


def _mean(values: list[float]) -> float | None:
    defined = [v for v in values if not math.isnan(v)]
    return statistics.mean(defined) if defined else None


def measure(args: argparse.Namespace) -> dict[str, Any]:
    """Trace statistics and every predictor's figures after each step."""
    trace = synthetic_trace(args.seed, prompts=args.prompts, samples=args.samples, epochs=args.epochs)
    scored = [views[-1] for epoch in trace[args.warmup :] for views in epoch]
    tokens = sorted(view.tokens for view in scored)
    out: dict[str, Any] = {
        "trace": {
            "trajectories_per_epoch": len(trace[0]),
            "epochs": len(trace),
            "scored_epochs": len(trace) - args.warmup,
            "mean_tokens": statistics.mean(tokens),
            "p90_tokens": tokens[int(0.9 * (len(tokens) - 1))],
            "max_tokens": tokens[-1],
            "mean_turns": statistics.mean(view.turns for view in scored),
        },
        "predictors": {},
    }
    for name in PREDICTORS:
        scores = replay(make_predictor(name), trace, STEPS, warmup=args.warmup, fraction=args.fraction)
        out["predictors"][name] = {
            f"step_{step}": {
                "recall": statistics.mean(a.recall for a in runs),
                "pearson": _mean([a.pearson for a in runs]),
                "recall_per_epoch": [a.recall for a in runs],
                "pearson_per_epoch": [None if math.isnan(a.pearson) else a.pearson for a in runs],
            }
            for step, runs in scores.items()
        }
    return out


def _fmt(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3f}"


def print_table(report: dict[str, Any], args: argparse.Namespace) -> None:
    trace = report["trace"]
    print(
        f"synthetic trace: {trace['trajectories_per_epoch']} trajectories per epoch, {trace['scored_epochs']} "
        f"scored epochs after {args.warmup} of warm-up; response tokens mean {trace['mean_tokens']:.0f}, "
        f"p90 {trace['p90_tokens']}, max {trace['max_tokens']}; turns mean {trace['mean_turns']:.2f}"
    )
    top = f"recall@{100 * args.fraction:g}%"
    titles = ["predictor", *(f"{top} step {s}" for s in STEPS), *(f"Pearson step {s}" for s in STEPS)]
    widths = [max(len(t), 12) for t in titles]
    print("\n  " + "  ".join(t.ljust(w) for t, w in zip(titles, widths, strict=True)))
    for name, figures in report["predictors"].items():
        cells = [
            name,
            *(_fmt(figures[f"step_{s}"]["recall"]) for s in STEPS),
            *(_fmt(figures[f"step_{s}"]["pearson"]) for s in STEPS),
        ]
        print("  " + "  ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)))


def build_checks(report: dict[str, Any], args: argparse.Namespace) -> list[dict[str, Any]]:
    online, base = report["predictors"]["online"], report["predictors"]["source_mean"]
    rows = []
    for step in STEPS:
        for figure, title in (("recall", f"recall@{100 * args.fraction:g}%"), ("pearson", "Pearson r")):
            value, baseline = online[f"step_{step}"][figure], base[f"step_{step}"][figure]
            rows.append(
                check(
                    f"{title} after step {step}",
                    f"online {_fmt(value)}",
                    f"source_mean {_fmt(baseline)}",
                    "> baseline",
                    value is not None and baseline is not None and value > baseline,
                )
            )
    for figure in ("recall", "pearson"):
        first, second = online["step_1"][figure], online["step_2"][figure]
        rows.append(
            check(
                f"online {figure}: refined by step 2", _fmt(second), f"step 1 {_fmt(first)}", "> step 1", second > first
            )
        )
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", type=Path, help="write the figures to this file")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--prompts", type=positive_int, default=96, help="prompts in the trace")
    parser.add_argument("--samples", type=positive_int, default=8, help="trajectories per prompt per epoch")
    parser.add_argument("--epochs", type=positive_int, default=6, help="epochs in the trace")
    parser.add_argument("--warmup", type=int, default=2, help="epochs learnt before scoring starts")
    parser.add_argument("--fraction", type=float, default=0.1, help="the longest share whose recall is measured")
    args = parser.parse_args(argv)
    if not 0 <= args.warmup < args.epochs:
        parser.error("--warmup must be at least 0 and less than --epochs")
    if not 0 < args.fraction <= 1:
        parser.error("--fraction must be in (0, 1]")
    started = time.monotonic()
    report: dict[str, Any] = report_header(args)
    failures: dict[str, str] = {}
    try:
        report.update(measure(args))
        report["checks"] = build_checks(report, args)
    except Exception as exc:  # a part that cannot run at all
        failures["predictor"] = f"{type(exc).__name__}: {exc}"
    report["elapsed_s"] = time.monotonic() - started
    report["failures"] = failures
    if "checks" in report:
        print_table(report, args)
        print_checks(report["checks"])
    return finish(report, failures, args.json, None)


if __name__ == "__main__":
    sys.exit(main())

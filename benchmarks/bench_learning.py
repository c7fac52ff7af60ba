"""Benchmark: does a policy trained through prorl-server improve? GRPO with the real vLLM against a control.

Run it from the repository root (after `bash scripts/train.sh` or `bash scripts/setup-vllm.sh && bash
scripts/bootstrap.sh train`)::

    .venv/bin/python benchmarks/bench_learning.py [--json out.json] [--plot docs/learning_curve.png]
        [--task echo|file_question] [--steps 16] [--eval-every 4] [--eval-samples 4] [--lr 1e-5]
        [--loss clip|tis] [--seed 0] [--final-eval-k 4] [--control-steps N]

About 25 minutes on 2 cores with the defaults: this is the full learning run the issue asks for, so it
runs longer than the other benchmarks' 5 minutes (`--steps 4` gives a quick look). Two runs of
`examples/train_grpo.py`'s loop in this process, one after the other, each with a fresh vLLM (CPU build,
weight reload on) and a fresh prorl-server, the same seeds and the same task:

- **trained**: each step's new weights are saved and reloaded into vLLM (`POST /weights/swap` with
  `reload`), so the next step samples from the updated policy;
- **control** (the baseline): the same loop with the weight update switched off, so vLLM keeps sampling
  (and the held-out set keeps being scored) with the initial weights. `--control-steps 0` skips its steps
  (they change nothing an evaluation sees): the untrained policy is scored before and at the end only.

The task (`--task`, default `echo`) is `short_answer`'s learning set: "Reply with just the word: W", two
tries (a wrong first reply is told so), reward 1 when the word appears in the last reply. Untrained
SmolLM2-135M-Instruct at temperature 1 gets it right about one time in six (0.18 on the held-out words): inside the 10-50% band where GRPO
groups are informative (most groups mix rewards), and the skill (repeat the word asked for) carries over
to words never trained on, which is what the held-out set measures. `--task file_question` is the tool-use
task: the word is in a file of the job's sandbox, which the model can only read with a `bash` tool call
(after three worked examples in the prompt), then say; docs/trainers.md has its curve. At the end of each run
the held-out set is scored once more by `prorl-server eval --k 4` (`--final-eval-k`): pass@1 and pass@4.

Targets: held-out reward (mean of K samples at temperature 1) of the trained policy >= the control's + 0.2
at the last evaluation, and so its pass@1 in the closing `prorl-server eval`; weight sync (save + reload)
<= 10% of a step; the training-inference mismatch at step 0 (same weights on both sides) reported for the
returned ids and for re-encoded text.

JSON output (`--json PATH`)::

    {
      "machine": {"cpus", "python", "load_avg_1m_at_start"},
      "config": {every command-line option},
      "runs": {"trained" | "control": {
          "config": {the loop's TrainConfig}, "held_out_initial": {"greedy", "mean", "pass_at_k"},
          "probe_logprob_initial",
          "mismatch_step0": {"returned_ids" | "reencoded_text": {"tokens", "mean_abs", "max_abs", "out_of_band",
                                                                "turns", "turns_retokenized"}},
          "final_eval": {"k", "instances", "samples", "failed", "mean_reward", "pass_at_1", "pass_at_k",
                         "mean_tokens"} (prorl-server eval's overall row),
          "steps": [{"step", "version", "train_reward", "loss", "kl", "mismatch_mean", "mismatch_max",
                     "mismatch_out", "clip_fraction", "tokens", "masked_tokens", "off_policy_rows",
                     "sampled_versions", "probe_logprob", "rollout_s", "train_s", "sync_s", "save_s", "step_s",
                     "held_out": {"greedy", "mean", "pass_at_k"} or {}}],
          "wall_s"}},
      "summary": {"held_out_trained", "held_out_control", "held_out_gain", "greedy_trained", "greedy_control",
                  "eval_pass_at_1_trained", "eval_pass_at_1_control", "eval_pass_at_k_trained",
                  "eval_pass_at_k_control",
                  "minutes_trained", "sync_share", "sync_s_mean", "step_s_mean", "mismatch_ids_mean",
                  "mismatch_text_mean"},
      "checks": [{"metric", "value", "baseline", "target", "pass"}],
      "elapsed_s"
    }
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from _report import check, finish, positive_int, print_checks, report_header

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))

import train_grpo

from prorl_server.launch import run_with_stack


def last_held_out(run: dict[str, Any]) -> dict[str, float]:
    return next((s["held_out"] for s in reversed(run["steps"]) if s["held_out"]), run["held_out_initial"])


def summarise(trained: dict[str, Any], control: dict[str, Any]) -> dict[str, Any]:
    steps = trained["steps"]
    ids = trained["mismatch_step0"]["returned_ids"]
    text = trained["mismatch_step0"]["reencoded_text"]
    held_trained, held_control = last_held_out(trained), last_held_out(control)
    return {
        "held_out_trained": held_trained["mean"],
        "held_out_control": held_control["mean"],
        "held_out_gain": held_trained["mean"] - held_control["mean"],
        "greedy_trained": held_trained["greedy"],
        "greedy_control": held_control["greedy"],
        "eval_pass_at_1_trained": trained["final_eval"]["pass_at_1"],
        "eval_pass_at_1_control": control["final_eval"]["pass_at_1"],
        "eval_pass_at_k_trained": trained["final_eval"]["pass_at_k"],
        "eval_pass_at_k_control": control["final_eval"]["pass_at_k"],
        "eval_k": trained["final_eval"]["k"],
        "minutes_trained": trained["wall_s"] / 60,
        "sync_share": statistics.fmean(s["sync_s"] / s["step_s"] for s in steps),
        "sync_s_mean": statistics.fmean(s["sync_s"] for s in steps),
        "step_s_mean": statistics.fmean(s["step_s"] for s in steps),
        "mismatch_ids_mean": ids["mean_abs"],
        "mismatch_ids_max": ids["max_abs"],
        "mismatch_ids_out": ids["out_of_band"],
        "mismatch_text_mean": text["mean_abs"],
        "mismatch_text_max": text["max_abs"],
        "mismatch_text_out": text["out_of_band"],
        "turns_retokenized": f"{text['turns_retokenized']}/{text['turns']}",
    }


def checks(summary: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        check(
            "held-out reward, trained (mean of K)",
            f"{summary['held_out_trained']:.2f}",
            f"control {summary['held_out_control']:.2f}",
            ">= control + 0.20",
            summary["held_out_gain"] >= 0.2,
        ),
        check(
            "held-out greedy reward, trained",
            f"{summary['greedy_trained']:.2f}",
            f"control {summary['greedy_control']:.2f}",
            "-",
            None,
        ),
        check(
            "held-out pass@1, prorl-server eval",
            f"{summary['eval_pass_at_1_trained']:.2f}",
            f"control {summary['eval_pass_at_1_control']:.2f}",
            ">= control + 0.20",
            summary["eval_pass_at_1_trained"] >= summary["eval_pass_at_1_control"] + 0.2,
        ),
        check(
            f"held-out pass@{summary['eval_k']}, prorl-server eval",
            f"{summary['eval_pass_at_k_trained']:.2f}",
            f"control {summary['eval_pass_at_k_control']:.2f}",
            "-",
            None,
        ),
        check(
            "wall time of the trained run",
            f"{summary['minutes_trained']:.1f} min",
            "",
            "<= 30 min",
            summary["minutes_trained"] <= 30,
        ),
        check(
            "weight sync (save + reload) share of a step",
            f"{summary['sync_share']:.1%}",
            f"{summary['sync_s_mean']:.2f} s of {summary['step_s_mean']:.1f} s",
            "<= 10%",
            summary["sync_share"] <= 0.10,
        ),
        check(
            "mismatch at step 0, returned ids: mean |dlogp|",
            f"{summary['mismatch_ids_mean']:.2e}",
            f"re-encoded text {summary['mismatch_text_mean']:.2e}",
            "reported",
            None,
        ),
        check(
            "tokens with ratio outside [0.8, 1.25] at step 0",
            f"{summary['mismatch_ids_out']:.2%}",
            f"re-encoded text {summary['mismatch_text_out']:.2%} ({summary['turns_retokenized']} turns re-tokenized)",
            "reported",
            None,
        ),
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", type=Path)
    parser.add_argument("--plot", type=Path, help="draw both runs' learning curves into this PNG")
    parser.add_argument("--task", choices=sorted(train_grpo.TASKS), default="echo")
    parser.add_argument("--steps", type=positive_int, default=16)
    parser.add_argument("--eval-every", type=positive_int, default=4)
    parser.add_argument("--eval-samples", type=positive_int, default=4, help="K samples per held-out instance")
    parser.add_argument("--lr", type=float, default=1e-5)
    parser.add_argument("--loss", choices=["clip", "tis"], default="clip")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--final-eval-k", type=positive_int, default=4, help="k of the closing prorl-server eval")
    parser.add_argument(
        "--control-steps",
        type=int,
        help="steps of the control run (default: --steps); 0 scores the untrained policy only (the weights it "
        "samples with never change, so its steps change nothing the evaluations see)",
    )
    args = parser.parse_args()
    if (problem := train_grpo.missing_requirements()) is not None:
        print(f"ERROR: {problem}")
        return 1
    started = time.monotonic()
    report = report_header(args)
    runs: dict[str, dict[str, Any]] = {}
    failures: dict[str, str] = {}
    control_steps = args.steps if args.control_steps is None else args.control_steps
    if control_steps < 0:
        parser.error("--control-steps must be >= 0")
    for name, update in (("trained", True), ("control", False)):
        config = train_grpo.TrainConfig(
            steps=args.steps if update else control_steps,
            eval_every=args.eval_every,
            eval_samples=args.eval_samples,
            lr=args.lr,
            loss=args.loss,
            seed=args.seed,
            update=update,
            task=args.task,
            final_eval_k=args.final_eval_k,
        )
        print(f"\n=== {name} run ({'weights pushed to vLLM each step' if update else 'weight update off'}) ===")
        out: dict[str, Any] = {}
        run_started = time.monotonic()
        code = run_with_stack("prorl-bench-learning-", lambda stack, c=config, o=out: train_grpo.run(stack, c, out=o))
        out["wall_s"] = time.monotonic() - run_started
        if code != 0 or (config.steps and not out.get("steps")):
            failures[name] = f"the {name} run ended with exit code {code}"
            continue
        if out.get("steps"):
            print("\n" + train_grpo.summary(out))
        runs[name] = out
    report["runs"] = runs
    if not failures:
        summary = summarise(runs["trained"], runs["control"])
        report["summary"] = summary
        report["checks"] = checks(summary)
        print_checks(report["checks"])
        if args.plot:
            from prorl_server.training.report import plot_learning_curve

            plot_learning_curve(
                runs,
                args.plot,
                title=f"GRPO on SmolLM2-135M-Instruct through prorl-server, real vLLM on 2 CPU cores "
                f"({args.task}, lr {args.lr:g}, {args.loss}, seed {args.seed})",
            )
            print(f"learning curves drawn to {args.plot}")
    report["elapsed_s"] = time.monotonic() - started
    return finish(report, failures, args.json, None)


if __name__ == "__main__":
    sys.exit(main())

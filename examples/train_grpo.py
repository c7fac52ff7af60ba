"""Watch a model learn through prorl-server on a laptop CPU: GRPO on SmolLM2-135M-Instruct with the real vLLM.

    bash scripts/train.sh                       # sets up what it needs, then runs this with the defaults
    .venv/bin/python examples/train_grpo.py --steps 30 --plot curve.png --json history.json

It starts the real vLLM (CPU build, `scripts/setup-vllm.sh`, with its weight-reload endpoints) and a
prorl-server with the first-party handlers as child processes (stopped on exit, Ctrl-C or an error), loads
the same float32 weights into torch on the trainer's side, and then, per step:

1. **rollout**: `SyncDapoCollector` gathers B informative groups of G samples (reward variance > 0) of the
   learning task (`--task`): `echo` (the default, the `short_answer` handler's "Reply with just the word: W",
   two tries: a wrong first reply is told so, so observation tokens sit between the model's turns and are
   masked out of the loss) or `file_question` (a word in a file of the job's sandbox that only a `bash` tool
   call can read, after three worked examples; the tool's output is masked out); LLM dispatching is then paused
   while the trainer has the cores;
2. **train**: group-relative advantages; the trainer recomputes the logprobs of the returned ids and takes
   a policy-gradient step (`--loss clip` PPO-style or `--loss tis` truncated importance sampling, the
   ratio against the rollout's own `response_logprobs`) with AdamW;
3. **sync**: the new weights are saved (safetensors, in /dev/shm) and `POST /weights/update` with `reload`
   makes vLLM load them before dispatching resumes (`CheckpointSync`), so the next step's turns carry weight
   version step + 1 (bounded staleness: `--max-staleness 1` on the server).

Every `--eval-every` steps the held-out instances (words never trained on) are scored through prorl-server:
greedy, and K samples at temperature 1 (their mean reward, and pass@K); `--final-eval-k N` scores them once
more at the end with `prorl-server eval --k N` (pass@1, pass@N). It prints a progress bar per step and a
table row (train and held-out reward, KL to the initial policy, the training-inference mismatch on the
trajectories sampled under the trainer's current weights, the share clipped, the trajectories with turns of
an older version, the time split into rollout / train / sync; docs/trainers.md explains each column), and
with `--plot` draws the learning curve as a PNG; `--mlflow-uri URI` and `--wandb-offline DIR` log the run (the
config, each step's figures, the summary and the history) as `prorl-server eval` logs its report. `--no-update` is
the control: the same loop with the weight update switched off (vLLM keeps the initial weights).
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from prorl_server.client import SyncDapoCollector, SyncRolloutClient
from prorl_server.launch import LocalStack, run_with_stack
from prorl_server.protocol import GroupResult, JobResult

PROBE = "The quick brown fox jumps over the lazy dog, and then it runs back home."
SETUP_HINT = "bash scripts/train.sh (or: bash scripts/setup-vllm.sh && bash scripts/bootstrap.sh train)"


@dataclass(frozen=True)
class LearningTask:
    """A task to learn: the first-party handler whose `learning_tasks(split)` gives its train and held-out
    instances, and the reply length and turns that suit it."""

    handler: str
    max_tokens: int
    max_turns: int
    about: str

    def instances(self, split: str) -> list[dict[str, Any]]:
        """The handler's instances of `split` ("train" or "held_out")."""
        return importlib.import_module(f"prorl_handlers.{self.handler}").learning_tasks(split)


TASKS = {
    "echo": LearningTask("short_answer", 12, 2, '"Reply with just the word: W", two tries'),
    "file_question": LearningTask(
        "file_question", 40, 2, "the word in a file of the job's sandbox, read with the bash tool (a tool call)"
    ),
}


@dataclass
class TrainConfig:
    """Everything a run depends on (the benchmark runs two of these: trained and control)."""

    steps: int = 16
    groups: int = 4  # informative groups per step (B)
    group_size: int = 8  # samples per group (G)
    lr: float = 1e-5
    loss: str = "clip"
    task: str = "echo"  # a key of TASKS
    max_tokens: int | None = None  # None: the task's
    max_turns: int | None = None  # None: the task's
    eval_every: int = 4
    eval_samples: int = 4  # K: samples per held-out word at temperature 1 (mean reward and pass@K)
    held_out_words: int | None = None  # score only the first N held-out words (default: all 24)
    max_staleness: int = 1
    seed: int = 0
    update: bool = True  # False: the control run, vLLM keeps the initial weights
    vllm_seqs: int = 8
    final_eval_k: int = 0  # > 0: at the end, score the held-out set with `prorl-server eval --k N`

    def __post_init__(self) -> None:
        learning = TASKS[self.task]  # KeyError: an unknown task
        if self.max_tokens is None:
            self.max_tokens = learning.max_tokens
        if self.max_turns is None:
            self.max_turns = learning.max_turns

    def sampling(self, temperature: float, seed: int | None = None) -> dict[str, Any]:
        """A job's sampling params."""
        params: dict[str, Any] = {"temperature": temperature, "max_tokens": self.max_tokens}
        return params if seed is None else params | {"seed": seed}


@dataclass
class StepRow:
    """One step's figures (the table row, the JSON record, a point of the curve)."""

    step: int
    version: int
    train_reward: float
    loss: float
    kl: float
    mismatch_mean: float
    mismatch_max: float
    mismatch_out: float
    clip_fraction: float
    tokens: int
    masked_tokens: int
    off_policy_rows: int  # trajectories with a turn sampled under an older version (carried-over groups)
    sampled_versions: list[int]
    probe_logprob: float  # the engine's summed logprob of PROBE after this step's sync
    rollout_s: float
    train_s: float
    sync_s: float
    save_s: float = 0.0
    held_out: dict[str, float] = field(default_factory=dict)

    @property
    def step_s(self) -> float:
        return self.rollout_s + self.train_s + self.sync_s


COLUMNS = (
    ("step", 4),
    ("ver", 3),
    ("train_r", 7),
    ("held_r", 6),
    ("greedy", 6),
    ("pass@k", 6),
    ("KL", 7),
    ("|dlogp|", 7),
    ("clip", 5),
    ("stale", 5),
    ("rollout_s", 9),
    ("train_s", 7),
    ("sync_s", 6),
)


def table_row(row: StepRow) -> str:
    held = row.held_out
    cells = [
        row.step,
        row.version,
        f"{row.train_reward:.2f}",
        f"{held['mean']:.2f}" if held else "",
        f"{held['greedy']:.2f}" if held else "",
        f"{held['pass_at_k']:.2f}" if held else "",
        f"{row.kl:.4f}",
        f"{row.mismatch_mean:.4f}",
        f"{row.clip_fraction:.2f}",
        row.off_policy_rows,
        f"{row.rollout_s:.1f}",
        f"{row.train_s:.1f}",
        f"{row.sync_s:.1f}",
    ]
    return "  ".join(f"{cell!s:>{width}}" for cell, (_, width) in zip(cells, COLUMNS, strict=True))


def table_header() -> str:
    names = "  ".join(f"{name:>{width}}" for name, width in COLUMNS)
    return names + "\n" + "  ".join("-" * width for _, width in COLUMNS)


def missing_requirements() -> str | None:
    """Why this example cannot run here, or None."""
    try:
        import torch  # noqa: F401
        import transformers  # noqa: F401
    except ImportError as exc:
        return f"the trainer needs torch and transformers ({exc.name} is missing): {SETUP_HINT}"
    try:
        import prorl_handlers  # noqa: F401
    except ImportError:
        return "the first-party handlers are not installed: .venv/bin/pip install -e handlers"
    from prorl_server.vllm_cpu import VllmCpuInstall, unsupported_reason

    if (reason := unsupported_reason()) is not None:
        return f"the real vLLM cannot run here: {reason}"
    if (missing := VllmCpuInstall.default().missing()) is not None:
        return f"the real vLLM is not set up ({missing}): {SETUP_HINT}"
    return None


def group_requests(config: TrainConfig) -> Iterator[dict[str, Any]]:
    """Endless group requests over the task's training instances, reshuffled each pass; member i of a group
    samples with seed + i, so a run is repeatable."""
    tasks = TASKS[config.task].instances("train")
    rng = random.Random(config.seed)
    seed = config.seed * 1_000_000
    while True:
        order = tasks[:]
        rng.shuffle(order)
        for instance in order:
            yield {
                "instance": instance,
                "n": config.group_size,
                "sampling_params": config.sampling(1.0, seed),
                "agent_config": {"max_turns": config.max_turns},
                "timeout": 300,
            }
            seed += config.group_size


def probe_logprob(llm: str) -> float:
    """The engine's summed logprob of the tokens of PROBE (vLLM's `prompt_logprobs`): it moves exactly when
    the weights the engine serves move."""
    import httpx

    body = {"prompt": PROBE, "max_tokens": 1, "temperature": 0.0, "prompt_logprobs": 0}
    answer = httpx.post(f"{llm}/completions", json=body, timeout=120, trust_env=False).raise_for_status().json()
    entries = answer["choices"][0]["prompt_logprobs"][1:]  # the first token has none
    return sum(next(iter(entry.values()))["logprob"] for entry in entries)


def held_out(config: TrainConfig) -> list[dict[str, Any]]:
    """The held-out instances scored during and after the run (the first `held_out_words`, or all)."""
    return TASKS[config.task].instances("held_out")[: config.held_out_words]


def evaluate(client: SyncRolloutClient, config: TrainConfig, seed: int) -> dict[str, float]:
    """Score the held-out instances through the server: greedy, and K samples at temperature 1."""
    tasks = held_out(config)
    agent = {"max_turns": config.max_turns}
    greedy_ids = client.jobs.submit_many(
        {"instance": t, "sampling_params": config.sampling(0.0), "agent_config": agent} for t in tasks
    )
    group_ids = [
        client.groups.submit(
            {
                "instance": t,
                "n": config.eval_samples,
                "sampling_params": config.sampling(1.0, seed + 100 * i),
                "agent_config": agent,
            }
        )
        for i, t in enumerate(tasks)
    ]
    greedy = [r.reward or 0.0 for r in client.jobs.collect(greedy_ids, ack=True)]
    sampled: list[list[float]] = []
    for group_id in group_ids:
        group = client.groups.wait(group_id, timeout=600)
        sampled.append([m.reward or 0.0 for m in group.members])
    flat = [r for rewards in sampled for r in rewards]
    return {
        "greedy": statistics.fmean(greedy),
        "mean": statistics.fmean(flat),
        "pass_at_k": statistics.fmean(1.0 if max(rewards) >= 1.0 else 0.0 for rewards in sampled),
    }


class Learner:
    """The policy on the trainer's side: the model, a frozen copy of the initial one (for the KL), AdamW."""

    def __init__(self, model_path: Path, config: TrainConfig) -> None:
        import torch
        import transformers
        from transformers import AutoModelForCausalLM, AutoTokenizer

        transformers.utils.logging.disable_progress_bar()  # no bars for loading and saving weights
        torch.manual_seed(config.seed)
        torch.set_num_threads(max(1, os.cpu_count() or 1))
        self.config = config
        self.tokenizer = AutoTokenizer.from_pretrained(model_path)
        self.model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
        self.reference = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).eval()
        self.reference.requires_grad_(False)
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=config.lr, weight_decay=0.0)
        self.pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0

    def train(self, results: list[JobResult], advantages: list[float], version: int) -> dict[str, float]:
        """One optimizer step on the batch; the loss, KL, mismatch and clip statistics. The mismatch is taken
        over the trajectories sampled entirely under `version` (the weights the trainer holds now)."""
        import torch

        from prorl_server.training import (
            LossConfig,
            LossStats,
            kl_to_reference,
            logprob_mismatch,
            policy_loss,
            token_batch,
            token_logprobs,
        )

        batch = token_batch(results, advantages, pad_id=self.pad_id)
        on_policy = torch.tensor([r.trajectory.weight_versions == [version] for r in results])
        loss_config = LossConfig(mode=self.config.loss)
        total = float(batch.model_tokens)
        stats, kl_sum, deltas = LossStats(), 0.0, []
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        micro = 8
        for start in range(0, batch.rows, micro):
            part = batch.select(slice(start, start + micro))
            logprobs = token_logprobs(self.model, part)
            loss, part_stats = policy_loss(logprobs, part, loss_config, tokens_in_batch=total)
            loss.backward()
            stats += part_stats
            with torch.no_grad():
                reference = token_logprobs(self.reference, part)
            kl_sum += kl_to_reference(logprobs.detach(), reference, part.loss_mask) * part_stats.tokens
            rows = on_policy[start : start + micro]
            if rows.any():
                deltas.append(logprob_mismatch(logprobs[rows], part.select_rows(rows)))
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.optimizer.step()
        tokens = sum(d.tokens for d in deltas) or 1
        return {
            "off_policy_rows": int((~on_policy).sum().item()),
            "loss": stats.loss,
            "kl": kl_sum / max(stats.tokens, 1.0),
            "clip_fraction": stats.clip_fraction,
            "mismatch_mean": sum(d.mean_abs * d.tokens for d in deltas) / tokens,
            "mismatch_max": max((d.max_abs for d in deltas), default=0.0),
            "mismatch_out": sum(d.out_of_band * d.tokens for d in deltas) / tokens,
            "tokens": int(batch.attention_mask.sum().item()),
            "masked_tokens": int(total),
        }

    def step0_mismatch(self, results: list[JobResult]) -> dict[str, dict[str, float | int]]:
        """At step 0 (the same weights on both sides): the mismatch on the returned ids, and had the
        trainer re-encoded the text instead."""
        import torch

        from prorl_server.training import logprob_mismatch, reencoded_mismatch, token_batch, token_logprobs

        batch = token_batch(results, [0.0] * len(results), pad_id=self.pad_id)
        with torch.no_grad():
            ids = logprob_mismatch(token_logprobs(self.model.eval(), batch), batch)
            reencoded = reencoded_mismatch(
                self.model,
                lambda text: self.tokenizer.encode(text, add_special_tokens=False),
                results,
                stop_ids=self.tokenizer.all_special_ids,
                pad_id=self.pad_id,
            )
        return {"returned_ids": ids.as_dict(), "reencoded_text": reencoded.as_dict()}


def final_eval(server: str, config: TrainConfig, directory: Path) -> dict[str, Any]:
    """`prorl-server eval` of the held-out instances, `config.final_eval_k` samples each at temperature 1, on
    the running server (the policy it serves now): its report's overall row (pass@1, pass@k, mean reward)."""
    tasks = directory / "held_out.jsonl"
    tasks.write_text("".join(json.dumps(t) + "\n" for t in held_out(config)))
    report = directory / "eval.json"
    argv = [sys.executable, "-m", "prorl_server.cli", "eval", str(tasks), "--server", server, "--no-progress"]
    argv += ["--k", str(config.final_eval_k), "--json", str(report)]
    argv += ["--sampling-params", json.dumps(config.sampling(1.0))]
    argv += ["--agent-config", json.dumps({"max_turns": config.max_turns})]
    subprocess.run(argv, check=True)  # its table goes to this process's output
    overall = json.loads(report.read_text())["overall"]
    return {"k": config.final_eval_k} | overall


def checkpoint_dir() -> str | None:
    """/dev/shm when it has room for two checkpoints (about 1.1 GB), else the default temporary directory."""
    try:
        room = os.statvfs("/dev/shm")
    except OSError:  # no /dev/shm here
        return None
    return "/dev/shm" if room.f_bavail * room.f_frsize > 2 * 1024**3 else None


def run(stack: LocalStack, config: TrainConfig, *, out: dict[str, Any], quiet: bool = False) -> int:
    """Start vLLM and the server on `stack`, train for `config.steps` steps; fills `out` with the history."""
    from tqdm import tqdm

    from prorl_server.training import CheckpointSync, group_advantages
    from prorl_server.vllm_cpu import VllmCpuInstall, VllmCpuSettings

    say = (lambda *_: None) if quiet else print
    model_path = VllmCpuInstall.default().require().model
    say(f"[1/3] starting the real vLLM (SmolLM2-135M-Instruct, float32, {config.vllm_seqs} sequences, weight reload)")
    started = time.monotonic()
    llm = stack.vllm(VllmCpuSettings(max_num_seqs=config.vllm_seqs, weight_reload=True))
    say(f"      {llm}, ready after {time.monotonic() - started:.0f} s")
    say("[2/3] starting prorl-server with the first-party handlers")
    server = stack.server(
        "--llm-server",
        llm,
        "--run-workers",
        "16",
        "--max-staleness",
        str(config.max_staleness),
        "--log-level",
        "warning",
    )
    say(f"      {server}; loading the policy into torch from {model_path}")
    learner = Learner(model_path, config)
    out.update(config=asdict(config), steps=[], mismatch_step0=None)
    with (
        tempfile.TemporaryDirectory(prefix="prorl-train-", dir=checkpoint_dir()) as ckpt,
        SyncRolloutClient(server, timeout=120.0, trust_env=False) as client,
    ):
        sync = CheckpointSync(client, Path(ckpt))
        client.weights.swap(0)  # the initial policy is version 0
        mode = "trained" if config.update else "control (weight update off)"
        say(
            f"[3/3] {config.steps} steps of {config.groups} informative groups x {config.group_size} samples of "
            f"{config.task} ({TASKS[config.task].about}), loss {config.loss}, lr {config.lr:g}, {mode}\n"
        )
        initial = evaluate(client, config, seed=999_000)
        say(
            f"held-out before training: mean reward {initial['mean']:.2f}, greedy {initial['greedy']:.2f}, "
            f"pass@{config.eval_samples} {initial['pass_at_k']:.2f}\n"
        )
        out["held_out_initial"] = initial
        out["probe_logprob_initial"] = probe_logprob(llm)
        say(table_header())
        with SyncDapoCollector(
            client, group_requests(config), target_groups=config.groups, max_groups_in_flight=config.groups
        ) as collector:
            version = 0
            for step in range(config.steps):
                bar = tqdm(total=config.groups + 2, desc=f"step {step}", leave=False, disable=quiet, unit="part")
                bar.set_postfix_str("rollout")
                t0 = time.monotonic()
                groups: list[GroupResult] = []
                while len(groups) < config.groups:
                    report = collector.collect_step(target=1)
                    groups.extend(report.groups)
                    bar.update(len(report.groups))
                    if report.exhausted:
                        break
                # nothing samples while the trainer has the cores; should this process die before the swap,
                # the pause lifts by itself after the server's --weight-pause-lease
                client.weights.pause()
                rollout_s = time.monotonic() - t0
                results = [r for g in groups for r in g.results]
                advantages = [a for g in groups for a in group_advantages([r.reward or 0.0 for r in g.results])]
                if step == 0:
                    out["mismatch_step0"] = learner.step0_mismatch(results)
                bar.set_postfix_str("train")
                t1 = time.monotonic()
                figures = learner.train(results, advantages, version)
                train_s = time.monotonic() - t1
                bar.update(1)
                bar.set_postfix_str("sync")
                save_s = sync_s = 0.0
                if config.update:
                    timing = sync.push(learner.model, step + 1)  # reload while paused, then resume
                    version, save_s, sync_s = step + 1, timing.save_s, timing.total_s
                else:
                    client.weights.resume()
                bar.update(1)
                bar.close()
                seen = sorted({v for r in results for v in r.trajectory.weight_versions if isinstance(v, int)})
                row = StepRow(
                    step=step,
                    version=version,
                    train_reward=statistics.fmean(r.reward or 0.0 for r in results),
                    rollout_s=rollout_s,
                    train_s=train_s,
                    sync_s=sync_s,
                    save_s=save_s,
                    sampled_versions=seen,
                    probe_logprob=probe_logprob(llm),
                    **figures,
                )
                if (step + 1) % config.eval_every == 0 or step + 1 == config.steps:
                    row.held_out = evaluate(client, config, seed=999_000 + step)
                out["steps"].append(asdict(row) | {"step_s": row.step_s})
                say(table_row(row), flush=True)
        if config.final_eval_k:
            say(f"\nscoring the held-out set with prorl-server eval, k = {config.final_eval_k}")
            out["final_eval"] = final_eval(server, config, Path(ckpt))
    return 0


def summary(out: dict[str, Any]) -> str:
    """The closing lines: held-out reward before and after, the mismatch at step 0, the sync share."""
    steps = out["steps"]
    if not steps:
        return "no step ran"
    last = next((s["held_out"] for s in reversed(steps) if s["held_out"]), {})
    before = out["held_out_initial"]
    sync_share = statistics.fmean(s["sync_s"] / s["step_s"] for s in steps if s["step_s"] > 0)
    lines = [
        f"held-out mean reward {before['mean']:.2f} -> {last.get('mean', float('nan')):.2f}, "
        f"greedy {before['greedy']:.2f} -> {last.get('greedy', float('nan')):.2f}",
        f"weight sync (save + reload) {statistics.fmean(s['sync_s'] for s in steps):.2f} s a step, "
        f"{sync_share:.1%} of a step",
    ]
    if m := out.get("mismatch_step0"):
        ids, text = m["returned_ids"], m["reencoded_text"]
        lines.append(
            f"mismatch at step 0 (same weights): returned ids mean |dlogp| {ids['mean_abs']:.2e}, max "
            f"{ids['max_abs']:.2e}, {ids['out_of_band']:.2%} of {ids['tokens']} tokens outside [0.8, 1.25]; "
            f"re-encoded text: mean {text['mean_abs']:.2e}, max {text['max_abs']:.2e}, {text['out_of_band']:.2%} "
            f"outside, {text['turns_retokenized']} of {text['turns']} turns re-tokenized differently"
        )
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> tuple[TrainConfig, argparse.Namespace]:
    defaults = TrainConfig()
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=defaults.steps, help="optimizer steps")
    parser.add_argument("--groups", type=int, default=defaults.groups, help="informative groups per step (B)")
    parser.add_argument("--group-size", type=int, default=defaults.group_size, help="samples per group (G)")
    parser.add_argument("--lr", type=float, default=defaults.lr, help="AdamW learning rate")
    parser.add_argument("--loss", choices=["clip", "tis"], default=defaults.loss, help="importance correction")
    parser.add_argument(
        "--task", choices=sorted(TASKS), default=defaults.task, help="what to learn (see the docstring)"
    )
    parser.add_argument("--max-tokens", type=int, help="max_tokens of each reply (default: the task's)")
    parser.add_argument("--max-turns", type=int, help="turns per episode (default: the task's)")
    parser.add_argument("--eval-every", type=int, default=defaults.eval_every, help="steps between held-out scores")
    parser.add_argument("--eval-samples", type=int, default=defaults.eval_samples, help="K for the held-out set")
    parser.add_argument("--held-out-words", type=int, help="score only the first N held-out instances (default: all)")
    parser.add_argument(
        "--final-eval-k", type=int, default=0, help="at the end, score the held-out set with prorl-server eval --k N"
    )
    parser.add_argument("--seed", type=int, default=defaults.seed, help="word order, sampling seeds, torch")
    parser.add_argument("--no-update", action="store_true", help="control: never push the weights to vLLM")
    parser.add_argument("--json", type=Path, help="write the history (config, steps, mismatch) here")
    parser.add_argument("--plot", type=Path, help="draw the learning curve into this PNG")
    parser.add_argument("--mlflow-uri", help="log the run (config, per-step figures, summary) to this MLflow URI")
    parser.add_argument("--wandb-offline", type=Path, metavar="DIR", help="log the run to an offline W&B run here")
    parser.add_argument("--experiment", default="prorl-train-grpo", help="MLflow experiment / W&B project")
    parser.add_argument("--run-name", help="MLflow / W&B run name")
    args = parser.parse_args(argv)
    given = [n for n in (args.max_tokens, args.max_turns) if n is not None]  # None: the task's
    if min(args.steps, args.groups, *given, args.eval_every, args.eval_samples) < 1:
        parser.error("--steps, --groups, --max-tokens, --max-turns, --eval-every and --eval-samples must be >= 1")
    if args.final_eval_k < 0:
        parser.error("--final-eval-k must be >= 0")
    if args.held_out_words is not None and args.held_out_words < 1:
        parser.error("--held-out-words must be >= 1")
    if args.group_size < 2:
        parser.error("--group-size must be at least 2 (a group of one has no variance)")
    if not args.lr > 0:
        parser.error("--lr must be > 0")
    from prorl_server.evaluation import EvalError, tracking

    try:  # a tracker that is not installed is said before the run, not after it
        for module, wanted in (("mlflow", args.mlflow_uri), ("wandb", args.wandb_offline)):
            if wanted:
                tracking.require(module)
    except EvalError as exc:
        parser.error(str(exc))
    config = TrainConfig(
        steps=args.steps,
        groups=args.groups,
        group_size=args.group_size,
        lr=args.lr,
        loss=args.loss,
        task=args.task,
        max_tokens=args.max_tokens,
        max_turns=args.max_turns,
        eval_every=args.eval_every,
        eval_samples=args.eval_samples,
        held_out_words=args.held_out_words,
        seed=args.seed,
        update=not args.no_update,
        final_eval_k=args.final_eval_k,
    )
    return config, args


def main(argv: list[str] | None = None) -> int:
    config, args = parse_args(argv)
    if (problem := missing_requirements()) is not None:
        print(f"ERROR: {problem}")
        return 2
    out: dict[str, Any] = {}
    code = run_with_stack("prorl-train-grpo-", lambda stack: run(stack, config, out=out))
    if out.get("steps"):
        print("\n" + summary(out))
        if args.json:
            args.json.write_text(json.dumps(out, indent=1))
            print(f"history written to {args.json}")
        if args.plot:
            from prorl_server.training.report import plot_learning_curve

            plot_learning_curve({"trained" if config.update else "control": out}, args.plot)
            print(f"learning curve drawn to {args.plot}")
        track(out, config, args)
    return code


def step_figures(step: dict[str, Any]) -> dict[str, float]:
    """A step's numbers as tracker metrics: its scalar fields, and `held_out/<figure>` when it was scored."""
    figures = {k: float(v) for k, v in step.items() if isinstance(v, int | float) and not isinstance(v, bool)}
    return figures | {f"held_out/{k}": float(v) for k, v in step.get("held_out", {}).items()}


def track(out: dict[str, Any], config: TrainConfig, args: argparse.Namespace) -> None:
    """Log the run to MLflow and/or an offline W&B run, as `prorl-server eval` does (the same flags): the
    config as parameters, each step's figures at its step, the summary and the history as files."""
    from prorl_server.evaluation import tracking

    run_params = asdict(config)
    steps = [step_figures(step) for step in out["steps"]]
    texts = {"summary.txt": summary(out), "history.json": json.dumps(out, indent=1)}
    if args.mlflow_uri:
        run_id = tracking.mlflow_run(args.mlflow_uri, args.experiment, args.run_name, run_params, steps, texts)
        print(f"MLflow run {run_id} at {args.mlflow_uri}")
    if args.wandb_offline:
        run_id = tracking.wandb_run(args.wandb_offline, args.experiment, args.run_name, run_params, steps, texts)
        print(f"W&B offline run {run_id} in {args.wandb_offline}")


if __name__ == "__main__":
    sys.exit(main())

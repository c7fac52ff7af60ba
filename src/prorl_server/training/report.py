"""The learning curve of one or more training runs as a PNG (matplotlib, headless).

A run is the history `examples/train_grpo.py` records: `held_out_initial` and `steps`, each step with its
`train_reward` and, every few steps, `held_out` (`mean`, `greedy`, `pass_at_k`).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any


def held_out_points(run: Mapping[str, Any], key: str = "mean") -> tuple[list[int], list[float]]:
    """(steps trained, held-out figure) pairs: the initial evaluation at 0, then each later one."""
    xs, ys = [0], [float(run["held_out_initial"][key])]
    for step in run["steps"]:
        if step.get("held_out"):
            xs.append(int(step["step"]) + 1)
            ys.append(float(step["held_out"][key]))
    return xs, ys


def plot_learning_curve(runs: Mapping[str, Mapping[str, Any]], path: Path, *, title: str | None = None) -> None:
    """Held-out reward (mean of K samples, and greedy) and train reward by step, one colour per run; a run's
    closing `prorl-server eval` (`final_eval`), when it has one, as its pass@1 after the last step."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (held, train) = plt.subplots(1, 2, figsize=(11, 4), constrained_layout=True)
    for index, (name, run) in enumerate(runs.items()):
        colour = f"C{index}"
        xs, ys = held_out_points(run, "mean")
        held.plot(xs, ys, marker="o", color=colour, label=f"{name}: mean of K samples")
        xs, ys = held_out_points(run, "greedy")
        held.plot(xs, ys, linestyle="--", marker=".", color=colour, alpha=0.7, label=f"{name}: greedy")
        steps = run["steps"]
        if final := run.get("final_eval"):  # prorl-server eval's pass@1 at the end (a line: a run of no step)
            label, at = f"{name}: pass@1, prorl-server eval (k={final['k']})", len(steps)
            if steps:
                held.plot(
                    [at], [final["pass_at_1"]], marker="*", markersize=12, color=colour, linestyle="", label=label
                )
            else:
                held.axhline(final["pass_at_1"], color=colour, linestyle=":", label=label)
        train.plot([s["step"] for s in steps], [s["train_reward"] for s in steps], color=colour, alpha=0.8, label=name)
    held.set(
        title="held-out instances (words never trained on)", xlabel="steps trained", ylabel="reward", ylim=(-0.02, 1.02)
    )
    train.set(title="training groups (informative ones)", xlabel="step", ylabel="mean reward", ylim=(-0.02, 1.02))
    held.legend(fontsize=8)
    train.legend(fontsize=8)
    held.grid(alpha=0.3)
    train.grid(alpha=0.3)
    if title:
        fig.suptitle(title, fontsize=10)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)

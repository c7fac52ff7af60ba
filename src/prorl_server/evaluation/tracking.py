"""Log a run to MLflow or to W&B (offline): an evaluation's report (`prorl-server eval`), or any run's
parameters, metrics per step and text files (`mlflow_run`, `wandb_run`: the trainer examples use them). Each
package is imported only when asked for."""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

from prorl_server.evaluation.errors import EvalError
from prorl_server.evaluation.report import OVERALL, Report, table

METRICS = ("mean_reward", "pass_at_1", "pass_at_k", "failed")
"""The row figures logged as metrics, `<source>/<figure>` (`overall/pass_at_k`, ...)."""


def params(report: Report) -> dict[str, Any]:
    """The run's parameters: k, server, tasks file, pass threshold."""
    return {"k": report.k, "server": report.server, "tasks": report.tasks, "pass_threshold": report.pass_threshold}


def metrics(report: Report) -> dict[str, float]:
    """`<source>/<figure>` for every source and `overall`, and `wall_s`."""
    rows = {**report.sources, OVERALL: report.overall}
    figures = {f"{name}/{figure}": float(getattr(r, figure)) for name, r in rows.items() for figure in METRICS}
    return figures | {"wall_s": report.wall_s}


def log_mlflow(report: Report, uri: str, experiment: str, run_name: str | None) -> str:
    """Log params, metrics and the table (`eval_table.txt`, `eval_report.json`) as a run; returns its id."""
    texts = {"eval_table.txt": table(report), "eval_report.json": report.model_dump_json(indent=2)}
    return mlflow_run(uri, experiment, run_name, params(report), [metrics(report)], texts)


def log_wandb(report: Report, directory: Path, project: str, run_name: str | None) -> str:
    """Log params, metrics and the table (a W&B Table and `eval_table.txt`) to an offline W&B run under
    `directory` (`wandb sync` uploads it later); returns its id."""
    columns = ["source", *report.overall.model_dump()]
    rows = [[name, *r.model_dump().values()] for name, r in [*report.sources.items(), (OVERALL, report.overall)]]
    tables = {"eval_table": (columns, rows)}
    return wandb_run(
        directory, project, run_name, params(report), [metrics(report)], {"eval_table.txt": table(report)}, tables
    )


def mlflow_run(
    uri: str,
    experiment: str,
    run_name: str | None,
    run_params: dict[str, Any],
    steps: list[dict[str, float]],
    texts: dict[str, str],
) -> str:
    """One MLflow run: `run_params`, the metrics of each step (`steps[i]` at step i) and `texts` as artifact
    files (name -> content); returns its id."""
    mlflow = require("mlflow")
    mlflow.set_tracking_uri(uri)
    mlflow.set_experiment(experiment)
    with mlflow.start_run(run_name=run_name) as run:
        mlflow.log_params(run_params)
        for step, figures in enumerate(steps):
            mlflow.log_metrics({_mlflow_key(key): value for key, value in figures.items()}, step=step)
        for name, text in texts.items():
            mlflow.log_text(text, name)
        return run.info.run_id


def wandb_run(
    directory: Path,
    project: str,
    run_name: str | None,
    run_params: dict[str, Any],
    steps: list[dict[str, float]],
    texts: dict[str, str],
    tables: dict[str, tuple[list[str], list[list[Any]]]] | None = None,
) -> str:
    """One offline W&B run under `directory`: `run_params` as its config, the metrics of each step, `tables`
    (name -> columns, rows) as W&B Tables and `texts` as the run's files; returns its id."""
    wandb = require("wandb")
    directory.mkdir(parents=True, exist_ok=True)
    run = wandb.init(project=project, name=run_name, dir=str(directory), mode="offline", config=run_params)
    try:
        for step, figures in enumerate(steps):
            run.log(figures, step=step)
        for name, (columns, rows) in (tables or {}).items():
            run.log({name: wandb.Table(columns=columns, data=rows)})
        for name, text in texts.items():
            (Path(run.dir) / name).write_text(text)  # the run's files, synced with it
        return run.id
    finally:
        run.finish()


@contextlib.contextmanager
def failing_as(tracker: str) -> Iterator[None]:
    """Any exception of the tracker's package as an EvalError of one line naming `tracker`."""
    try:
        yield
    except Exception as exc:  # a third-party package's errors: no common base to catch
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        raise EvalError(f"logging to {tracker} failed: {type(exc).__name__}: {first}") from None


def _mlflow_key(key: str) -> str:
    """MLflow allows letters, digits and `_-. /` in a metric name: any other character becomes `_`."""
    return "".join(ch if ch.isalnum() or ch in "_-. /" else "_" for ch in key)


PACKAGES = {"mlflow": "mlflow-skinny", "wandb": "wandb"}
"""Tracking module -> the smallest package that provides it."""


def require(module: str) -> ModuleType:
    """`module` (mlflow or wandb) imported, else EvalError saying what to install."""
    try:
        return importlib.import_module(module)
    except ImportError:
        raise EvalError(
            f"{module} is not installed: pip install {PACKAGES[module]} (or prorl-server[tracking])"
        ) from None

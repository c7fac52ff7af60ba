"""Helpers shared by the benchmark scripts: percentiles, the summary table and the common end of a run."""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
from pathlib import Path
from typing import Any


def report_header(args: argparse.Namespace) -> dict[str, Any]:
    """The start of a benchmark's JSON: the machine (CPUs, Python, load) and every command-line option."""
    return {
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "load_avg_1m_at_start": os.getloadavg()[0],
        },
        "config": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
    }


def positive_int(text: str) -> int:
    """argparse type: an integer >= 1."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of process `pid` (its threads included), from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def percentile_ms(values: list[float], pct: float) -> float:
    """Nearest-rank percentile of seconds, in milliseconds (NaN without values)."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    rank = min(len(ordered) - 1, max(0, math.ceil(pct / 100 * len(ordered)) - 1))
    return 1000 * ordered[rank]


def check(metric: str, value: Any, baseline: str, target: str, passed: bool | None) -> dict[str, Any]:
    """One row of the summary table (`passed` None: a figure without a target)."""
    return {"metric": metric, "value": value, "baseline": baseline, "target": target, "pass": passed}


def print_checks(rows: list[dict[str, Any]]) -> None:
    """The summary table: one row per check with metric, value, baseline, target and PASS/FAIL/-."""
    print("\nSummary")
    header = {"metric": "metric", "value": "value", "baseline": "baseline", "target": "target"}
    widths = [max(len(str(r.get(k, ""))) for r in [*rows, header]) for k in header]
    titles = ("metric", "value", "baseline", "target", "pass/fail")
    print("  " + "  ".join(h.ljust(w) for h, w in zip(titles, [*widths, 9], strict=True)))
    for r in rows:
        verdict = "-" if r["pass"] is None else ("PASS" if r["pass"] else "FAIL")
        cells = (r["metric"], r["value"], r.get("baseline", ""), r["target"], verdict)
        print("  " + "  ".join(str(c).ljust(w) for c, w in zip(cells, [*widths, 9], strict=True)))


def finish(report: dict[str, Any], failures: dict[str, str], json_path: Path | None, leftovers: str | None) -> int:
    """Print the parts that could not run and what was left running, write the JSON; returns the exit code
    (0 whatever the figures, 1 only when a part could not run)."""
    for key, message in failures.items():
        print(f"\nERROR: {key} could not be measured: {message}")
    if leftovers:
        print(f"\nWARNING: left running: {leftovers}")
    ending = "exit code 1: a part could not run" if failures else "exit code 0 whatever the figures"
    print(f"\n(total {report['elapsed_s']:.0f}s; {ending})")
    if json_path:
        json_path.write_text(json.dumps(report, indent=2) + "\n")
        print(f"figures written to {json_path}")
    return 1 if failures else 0


def children_run_this_checkout() -> None:
    """Put this checkout's `src` (and the handlers') first on PYTHONPATH, so that the child processes a
    benchmark starts run its code, not whatever prorl_server the interpreter has installed."""
    root = Path(__file__).resolve().parent.parent
    paths = [str(root / "src"), str(root / "handlers" / "src"), os.environ.get("PYTHONPATH", "")]
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)

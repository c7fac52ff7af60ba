"""Smoke test of benchmarks/bench_scheduling.py: a tiny run in a subprocess writes the documented JSON.

No timing is asserted: only that every configuration ran, the keys are there and the figures are positive.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from repo_paths import BENCHMARKS

BENCH = BENCHMARKS / "bench_scheduling.py"

CONFIG_KEYS = {
    "dispatch_policy",
    "placement",
    "max_inflight_per_backend",
    "vllm_priority",
    "warmup_makespan_s",
    "makespan_s",
    "throughput_tok_s",
    "completed",
    "failed",
    "longest_run_s",
    "longest_gate_queue_s",
    "longest_delay_s",
    "gate_queue_s_total",
    "last_trajectory",
    "cache_hit_rate",
    "preemptions",
    "vs_lower_bound",
}
PLAN_KEYS = {
    "trajectories",
    "turns_total",
    "output_tokens",
    "longest_alone_s",
    "capacity_tok_s",
    "work_bound_s",
    "lower_bound_s",
}


def test_bench_scheduling_tiny_run_writes_documented_json(tmp_path: Path) -> None:
    out = tmp_path / "out.json"
    command = [sys.executable, str(BENCH), "--json", str(out), "--workloads", "math", "--backends", "2"]
    command += ["--max-num-seqs", "4", "--prompts", "2", "--samples", "2", "--time-scale", "50"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=240, cwd=BENCH.parent.parent)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "Summary" in done.stdout
    report = json.loads(out.read_text())
    assert {"machine", "config", "placements_available", "skipped", "workloads", "checks", "elapsed_s"} <= set(report)
    assert list(report["workloads"]) == ["math"]
    entry = report["workloads"]["math"]
    assert set(entry["plan"]) >= PLAN_KEYS
    assert entry["plan"]["trajectories"] == 4
    assert entry["baseline"] == "fcfs+min_heap"
    assert entry["trajectory_aware"] in entry["configs"]
    assert entry["trajectory_aware"].startswith("progressive+")
    ran = set(entry["configs"]) | set(report["skipped"])
    assert {"fcfs+min_heap", entry["trajectory_aware"]} <= ran
    for label, figures in entry["configs"].items():
        assert set(figures) >= CONFIG_KEYS, label
        assert figures["makespan_s"] > 0, label
        assert figures["warmup_makespan_s"] > 0, label
        assert figures["throughput_tok_s"] > 0, label
        assert figures["completed"] == 4 and figures["failed"] == 0, label
        assert figures["cache_hit_rate"] is None or 0 <= figures["cache_hit_rate"] <= 1, label
    assert all({"metric", "value", "baseline", "target", "pass"} <= set(row) for row in report["checks"])

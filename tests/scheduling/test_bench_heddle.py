"""benchmarks/rollout_sim.py (the rollout simulation bench_heddle.py runs) and a tiny bench_heddle.py run.

The simulation is checked against times computed by hand; the benchmark run only for its documented JSON
(no timing is asserted).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from repo_paths import BENCHMARKS

BENCHMARKS = BENCHMARKS
sys.path.insert(0, str(BENCHMARKS))

from rollout_sim import HeddlePolicy, Plan, RouterPolicy, Worker, simulate  # noqa: E402

from prorl_server.scheduling.predictor import make_predictor  # noqa: E402
from prorl_server.scheduling.profile import Profile  # noqa: E402

PROFILE = Profile.from_points([(1, 0.01), (2, 0.015), (4, 0.02)])


def plan(key: str, tokens: tuple[int, ...], tool_s: float = 1.0, observation: int = 10) -> Plan:
    turns = len(tokens)
    return Plan(key, "coding", f"prompt-{key}", 100, tokens, (tool_s,) * (turns - 1), (observation,) * (turns - 1))


def test_a_trajectory_alone_takes_its_decode_prefill_and_tool_time() -> None:
    workers = [Worker(PROFILE.with_batch_limit(4), prefill_s_per_token=0.001)]
    outcome = simulate([plan("a", (50, 30))], workers, RouterPolicy("verl-like", cache_affine=False))
    # turn 1: 100 prompt tokens prefilled in its first step; turn 2: only the 10 observation tokens (cached)
    expected = 80 * 0.01 + 100 * 0.001 + 1.0 + 10 * 0.001
    assert outcome.makespan_s == pytest.approx(expected)
    assert outcome.cache_hit_rate == pytest.approx(1 - 110 / (100 + 160))
    assert outcome.output_tokens == 80 and outcome.migrations == 0


def test_a_batch_shares_steps_and_the_limit_makes_calls_wait() -> None:
    plans = [plan(f"t{i}", (20,)) for i in range(3)]
    shared = simulate(plans, [Worker(PROFILE.with_batch_limit(4), 0.0)], RouterPolicy("x", cache_affine=True))
    assert shared.makespan_s == pytest.approx(20 * PROFILE.seconds_per_token(3))
    one_slot = simulate(plans, [Worker(PROFILE.with_batch_limit(1), 0.0)], RouterPolicy("x", cache_affine=True))
    assert one_slot.makespan_s == pytest.approx(3 * 20 * 0.01)  # one at a time


def test_heddle_puts_a_predicted_long_trajectory_apart_and_every_trajectory_ends() -> None:
    predictor = make_predictor("online")
    plans = [plan("long", (400, 400)), *(plan(f"s{i}", (10, 10)) for i in range(6))]
    from bench_heddle import final_view

    for p in plans:
        predictor.observe_finished(final_view(p))
    workers = [Worker(PROFILE.with_batch_limit(8), 0.0) for _ in range(2)]
    policy = HeddlePolicy(predictor, workers, 0.0)
    outcome = simulate(plans, workers, policy)
    assert set(outcome.finish_s) == {p.key for p in plans} and all(outcome.finish_s.values())
    assert outcome.makespan_s == pytest.approx(outcome.finish_s["long"])
    alone = 800 * 0.01 + 1.0
    assert outcome.makespan_s < 1.2 * alone  # apart from the shorts, it runs nearly as if alone


def test_bench_heddle_tiny_run_writes_documented_json(tmp_path: Path) -> None:
    out = tmp_path / "out.json"
    command = [sys.executable, str(BENCHMARKS / "bench_heddle.py"), "--json", str(out), "--workers", "2"]
    command += ["--per-worker", "8", "--samples", "4", "--degrees", "1,2"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, cwd=BENCHMARKS.parent)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "SIMULATED" in done.stdout and "Summary" in done.stdout
    report = json.loads(out.read_text())
    assert report["simulated"] is True
    assert {"machine", "config", "trace", "profile", "allocation", "bounds", "configs", "checks", "elapsed_s"} <= set(
        report
    )
    assert report["trace"]["trajectories"] == 16
    assert sum(report["allocation"]["degrees"]) <= 2
    assert set(report["configs"]) == {"verl-like", "slime-like", "heddle", "heddle-hetero"}
    for label, figures in report["configs"].items():
        keys = {"workers", "makespan_s", "throughput_tok_s", "speedup", "cache_hit_rate", "moves", "vs_lower_bound"}
        assert keys <= set(figures), label
        assert figures["makespan_s"] > 0 and figures["vs_lower_bound"] >= 1 - 1e-9, label
    for kind in ("homogeneous", "heterogeneous"):
        bound = report["bounds"][kind]
        assert bound["lower_bound_s"] == max(bound["longest_alone_s"], bound["work_bound_s"])


def test_bench_scheduler_cost_tiny_run_writes_documented_json(tmp_path: Path) -> None:
    out = tmp_path / "out.json"
    command = [sys.executable, str(BENCHMARKS / "bench_scheduler_cost.py"), "--json", str(out), "--live", "300"]
    command += ["--backends", "4", "--trajectories", "200", "--baseline-trajectories", "5"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, cwd=BENCHMARKS.parent)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = json.loads(out.read_text())
    assert {"machine", "config", "fill_s", "heddle", "baseline", "checks", "elapsed_s"} <= set(report)
    keys = {"mean_turns", "per_turn_us", "place_new_us", "dp_solves", "dp_us", "at_boundary_us", "dispatch_us"}
    keys |= {"finish_us", "trajectories", "turns", "migrations"}
    for name in ("heddle", "baseline"):
        assert keys <= set(report[name]), name
        assert report[name]["per_turn_us"] > 0 and report[name]["mean_turns"] > 1, name
    assert report["heddle"]["trajectories"] == 200 and report["baseline"]["trajectories"] == 5
    assert report["baseline"]["dp_solves"] == 5  # a DP at every arrival
    assert report["heddle"]["dp_solves"] < 200  # the DP again only after a quarter of the live count arrived


def test_bench_heddle_takes_given_degrees_instead_of_annealing(tmp_path: Path) -> None:
    out = tmp_path / "out.json"
    command = [sys.executable, str(BENCHMARKS / "bench_heddle.py"), "--json", str(out), "--workers", "2"]
    command += ["--per-worker", "4", "--samples", "4", "--allocation", "2"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, cwd=BENCHMARKS.parent)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    allocation = json.loads(out.read_text())["allocation"]
    assert allocation["degrees"] == [2] and allocation["annealed"] is False

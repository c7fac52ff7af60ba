"""Benchmark: sandbox start-to-ready per runtime, where a bubblewrap start spends its time, many at once.

Run it from the repository root::

    .venv/bin/python benchmarks/bench_sandbox.py [--json out.json] [--runtimes bwrap,local] [--starts 100]

About a minute on a 2-core machine with the defaults. Runtimes that are not available here are skipped
with the reason. Other work on the machine skews the figures: the 1-minute load average at start is kept.

Part 1 - start-to-ready
    For each runtime, `--starts` sandboxes one after another (the default SandboxSpec: no network, default
    limits): the time from calling `runtime.start(spec)` to its return, which is when the execution server
    inside answered a ping over its Unix socket. Each sandbox is closed before the next starts (the close
    time is reported too); the runtimes take turns, so a change of load hits all alike. bubblewrap runs
    twice: as configured (`prewarm` launchers already inside their cgroups) and with `prewarm=0` (every
    start joins fresh cgroups itself). Target: bubblewrap p50 <= 50 ms.
Part 2 - where a bubblewrap start goes (medians of `--starts` runs each)
    `bwrap <the runtime's options> true` (namespaces and mounts), `python -I -S -c pass` (the interpreter),
    the execution server's imports (`import prorl_server.tools.__main__` minus the bare interpreter), and
    one cgroup v1 join after 100 ms of quiet (the RCU grace period that prewarming hides).
Part 3 - many at once
    For each runtime, `--concurrent` sandboxes started together (asyncio.gather); wall time until all
    answer; then each runs one command (its shell starts) and memory is measured: the proportional set
    size (PSS, shared pages split among their users) of every process of every sandbox, divided by N, and
    the drop of MemAvailable divided by N (adds kernel memory: page tables, tmpfs, cgroups). Then the wall
    time to close them all and whether any process, directory or cgroup is left.

JSON output (`--json PATH`); times in milliseconds::

    {
      "machine": {"cpus", "python", "platform", "load_avg_1m_at_start", "cgroups": [controllers]},
      "config": {every command-line option},
      "start": {runtime label: {"n", "p50_ms", "p99_ms", "min_ms", "close_p50_ms"}},
      "breakdown": {"bwrap_true_ms", "python_bare_ms", "tools_imports_ms", "cgroup_join_after_quiet_ms"},
      "concurrent": {runtime: {"n", "start_all_s", "pss_mb_per_sandbox", "mem_available_drop_mb_per_sandbox",
                               "processes_per_sandbox", "close_all_s", "leftovers"}},
      "skipped": {runtime: reason},
      "checks": [{"metric", "value", "target", "pass"}]
    }

Exit code 0 whatever the figures; 1 only if a part could not run at all.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from prorl_server.sandbox import Runtime, SandboxSpec, available, make_runtime, new_owner_id
from prorl_server.sandbox.cgroups import detect
from prorl_server.sandbox.reaper import reap, remove_owner_files, tagged_processes

TARGET_BWRAP_P50_MS = 50.0


def percentile(values: list[float], q: float) -> float:
    """The q-quantile (0..1) by nearest rank."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * len(ordered)) - 1))]


def mem_available_mb() -> float:
    """MemAvailable of /proc/meminfo in MB."""
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def pss_mb(pid: int) -> float:
    """Proportional set size of one process in MB (0 if it is gone)."""
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def median_ms(argv: list[str], runs: int) -> float:
    """Median wall time of running `argv` to completion."""
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        subprocess.run(argv, check=True, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times)


def spec_for(name: str, images: dict[str, str]) -> SandboxSpec:
    """The default spec, with the image given for this runtime (apptainer needs one)."""
    return SandboxSpec(image=images.get(name))


async def part_start(variants: dict[str, tuple[Runtime, SandboxSpec]], starts: int) -> dict[str, Any]:
    """Sequential start-to-ready and close times; the variants take turns, so load changes hit all alike."""
    ready: dict[str, list[float]] = {label: [] for label in variants}
    closing: dict[str, list[float]] = {label: [] for label in variants}
    for _ in range(starts):
        for label, (runtime, spec) in variants.items():
            started = time.perf_counter()
            sandbox = await runtime.start(spec)
            ready[label].append((time.perf_counter() - started) * 1000)
            started = time.perf_counter()
            await sandbox.close()
            closing[label].append((time.perf_counter() - started) * 1000)
            await asyncio.sleep(0.02)  # a quiet gap, as between jobs
    return {
        label: {
            "n": starts,
            "p50_ms": round(statistics.median(ready[label]), 1),
            "p99_ms": round(percentile(ready[label], 0.99), 1),
            "min_ms": round(min(ready[label]), 1),
            "close_p50_ms": round(statistics.median(closing[label]), 1),
        }
        for label in variants
    }


def part_breakdown(owner: str, runs: int) -> dict[str, float]:
    """Where a bubblewrap start goes (see the module docstring)."""
    from prorl_server.sandbox.bwrap import BwrapRuntime
    from prorl_server.sandbox.process_sandbox import host_python_path

    runtime = BwrapRuntime(owner, prewarm=0)
    sock = Path(f"/tmp/prorl-bench-{os.getpid()}")
    sock.mkdir(exist_ok=True)
    try:
        options = runtime.bwrap_args(SandboxSpec(), sock)
        bwrap = median_ms([runtime._bwrap, *options, "--", "true"], runs)
    finally:
        sock.rmdir()
    python = [sys.executable, "-I", "-S", "-c"]
    bare = median_ms([*python, "pass"], runs)
    imports = f"import sys; sys.path[:0] = {host_python_path()!r}; import prorl_server.tools.__main__"
    server = median_ms([*python, imports], runs)
    join = float("nan")
    pids = [h for h in runtime.cgroups if "pids" in h.controllers and h.version == 1]
    if pids:
        directory = pids[0].base / f"bench-{os.getpid()}"
        directory.mkdir()
        sleeper = subprocess.Popen(["sleep", "10"])
        try:
            time.sleep(0.1)
            started = time.perf_counter()
            (directory / "cgroup.procs").write_text(str(sleeper.pid))
            join = (time.perf_counter() - started) * 1000
        finally:
            sleeper.kill()
            sleeper.wait()
            time.sleep(0.05)
            directory.rmdir()
    return {
        "bwrap_true_ms": round(bwrap, 1),
        "python_bare_ms": round(bare, 1),
        "tools_imports_ms": round(server - bare, 1),
        "cgroup_join_after_quiet_ms": round(join, 1),
    }


async def part_concurrent(runtime: Runtime, owner: str, spec: SandboxSpec, count: int) -> dict[str, Any]:
    """Start `count` sandboxes at once, measure memory per sandbox, close them all."""
    before = mem_available_mb()
    started = time.perf_counter()
    sandboxes = await asyncio.gather(*(runtime.start(spec) for _ in range(count)))
    start_all = time.perf_counter() - started
    await asyncio.gather(*(s.bash("true") for s in sandboxes))
    await asyncio.sleep(0.5)
    processes = [p for p in tagged_processes() if p.owner == owner and p.sandbox_id in {s.id for s in sandboxes}]
    pss = sum(pss_mb(p.pid) for p in processes)
    drop = before - mem_available_mb()
    started = time.perf_counter()
    await asyncio.gather(*(s.close() for s in sandboxes))
    close_all = time.perf_counter() - started
    leftovers = [p.pid for p in tagged_processes() if p.sandbox_id in {s.id for s in sandboxes}]
    return {
        "n": count,
        "start_all_s": round(start_all, 2),
        "pss_mb_per_sandbox": round(pss / count, 1),
        "mem_available_drop_mb_per_sandbox": round(drop / count, 1),
        "processes_per_sandbox": round(len(processes) / count, 1),
        "close_all_s": round(close_all, 2),
        "leftovers": len(leftovers),
    }


async def run(args: argparse.Namespace) -> dict[str, Any]:
    """All parts; returns the JSON document."""
    reasons = available()
    names = [n for n in args.runtimes.split(",") if n]
    out: dict[str, Any] = {
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "platform": platform.platform(),
            "load_avg_1m_at_start": os.getloadavg()[0],
            "cgroups": sorted({c for h in detect(warn=False) for c in h.controllers}),
        },
        "config": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "start": {},
        "concurrent": {},
        "skipped": {n: reasons.get(n, "unknown runtime") for n in names if reasons.get(n, "unknown") is not None},
    }
    names = [n for n in names if n not in out["skipped"]]
    owners: list[str] = []

    def runtime_for(name: str, **options: Any) -> tuple[Runtime, str]:
        owner = new_owner_id()
        owners.append(owner)
        return make_runtime(name, owner, **options), owner

    try:
        variants: dict[str, tuple[Runtime, SandboxSpec]] = {}
        for name in names:
            variants[name] = (runtime_for(name)[0], spec_for(name, args.image))
            if name == "bwrap":
                variants["bwrap (prewarm=0)"] = (runtime_for(name, prewarm=0)[0], spec_for(name, args.image))
        await part_start(variants, min(5, args.starts))  # warm the page cache
        out["start"] = await part_start(variants, args.starts)
        for label, (runtime, _) in variants.items():
            getattr(runtime, "close", lambda: None)()
            print(f"start-to-ready {label:20s} {out['start'][label]}", flush=True)
        if "bwrap" in names:
            out["breakdown"] = part_breakdown(new_owner_id(), args.starts)
            print(f"bwrap breakdown {out['breakdown']}", flush=True)
        for name in names:
            runtime, owner = runtime_for(name)
            out["concurrent"][name] = await part_concurrent(runtime, owner, spec_for(name, args.image), args.concurrent)
            getattr(runtime, "close", lambda: None)()
            print(f"{args.concurrent} at once {name:8s} {out['concurrent'][name]}", flush=True)
    finally:
        for owner in owners:
            reap(owner=owner)
            remove_owner_files(owner)
    bwrap = out["start"].get("bwrap")
    out["checks"] = [
        {
            "metric": "bwrap start-to-ready p50 (ms)",
            "value": bwrap["p50_ms"] if bwrap else None,
            "target": TARGET_BWRAP_P50_MS,
            "pass": None if bwrap is None else bwrap["p50_ms"] <= TARGET_BWRAP_P50_MS,
        }
    ]
    return out


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line options."""
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    parser.add_argument("--json", type=Path, help="write the figures to this file")
    parser.add_argument("--runtimes", default="bwrap,local,apptainer", help="comma-separated runtime names")
    parser.add_argument("--starts", type=int, default=100, help="part 1: sequential starts per runtime")
    parser.add_argument("--concurrent", type=int, default=200, help="part 3: sandboxes started at once")
    parser.add_argument(
        "--image",
        action="append",
        default=[],
        metavar="RUNTIME=PATH",
        help="image for a runtime's sandboxes (apptainer needs one), e.g. apptainer=/tmp/apptainer-test/images/py.sif",
    )
    args = parser.parse_args(argv)
    args.image = dict(item.split("=", 1) for item in args.image)
    return args


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark, print a summary, optionally write JSON."""
    logging.basicConfig(level=logging.ERROR)
    args = parse_args(argv)
    try:
        out = asyncio.run(run(args))
    except Exception as exc:  # a part that cannot run at all
        print(f"benchmark failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    for name, reason in out["skipped"].items():
        print(f"skipped {name}: {reason}")
    for check in out["checks"]:
        print(f"{check['metric']}: {check['value']} (target <= {check['target']}, pass={check['pass']})")
    if args.json:
        args.json.write_text(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

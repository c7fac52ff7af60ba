"""Benchmark: sandbox start-to-ready per runtime, where a bubblewrap start spends its time, many at once.

Run it from the repository root::

    .venv/bin/python benchmarks/bench_sandbox.py [--json out.json] [--runtimes bwrap,local] [--starts 100]

About two minutes on a 2-core machine with the defaults. Runtimes that are not available here are skipped
with the reason. Other work on the machine skews the figures: the 1-minute load average at start is kept.

Part 1 - start-to-ready
    For each runtime, `--starts` sandboxes one after another (the default SandboxSpec: no network, default
    limits): the time from calling `runtime.start(spec)` to its return, which is when the execution server
    inside answered a ping over its Unix socket. Each sandbox is closed before the next starts (the close
    time is reported too); the runtimes take turns, so a change of load hits all alike. bubblewrap runs
    twice: as configured (`prewarm` launchers already inside their cgroups) and with `prewarm=0` (every
    start joins fresh cgroups itself). With Apptainer, a bare `apptainer exec IMAGE true` takes its turn as
    the baseline; with Podman, a bare `podman run --rm IMAGE true` (same OCI runtime, no network, no log).
    Targets: bubblewrap p50 <= 50 ms; Apptainer p50 within 1.2x, Podman p50 within 1.5x, of their bare run's
    p50.
Part 2 - where a bubblewrap start goes (medians of `--starts` runs each)
    `bwrap <the runtime's options> true` (namespaces and mounts), `python -I -S -c pass` (the interpreter),
    the execution server's imports (`import prorl_server.tool_server.__main__` minus the bare interpreter), and
    one cgroup v1 join after 100 ms of quiet (the RCU grace period that prewarming hides).
Part 3 - many at once
    For each runtime, `--concurrent` sandboxes started together (asyncio.gather); wall time until all
    answer; then each runs one command (its shell starts) and memory is measured: the proportional set
    size (PSS, shared pages split among their users) of every process of every sandbox, divided by N, and
    the drop of MemAvailable divided by N (adds kernel memory: page tables, tmpfs, cgroups). Then the wall
    time to close them all and whether any process, directory or cgroup is left. Podman starts
    `--concurrent-podman` (default 20) instead: each of its sandboxes keeps a podman client and a conmon.

JSON output (`--json PATH`); times in milliseconds::

    {
      "machine": {"cpus", "python", "platform", "load_avg_1m_at_start", "cgroups": [controllers]},
      "config": {every command-line option},
      "start": {runtime label, "apptainer exec IMAGE true" or "podman run IMAGE true":
                {"n", "p50_ms", "p99_ms", "min_ms", "close_p50_ms"}},
      "breakdown": {"bwrap_true_ms", "python_bare_ms", "tools_imports_ms", "cgroup_join_after_quiet_ms"},
      "concurrent": {runtime: {"n", "start_all_s", "pss_mb_per_sandbox", "mem_available_drop_mb_per_sandbox",
                               "processes_per_sandbox", "close_all_s", "leftovers"}},
      "skipped": {runtime: reason},
      "checks": [{"metric", "value", "baseline", "target", "pass"}],
      "elapsed_s"
    }

Exit code 0 whatever the figures; 1 only if a part could not run at all.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from _report import check, finish, percentile_ms, print_checks

from prorl_server.sandbox import Runtime, SandboxSpec, available, make_runtime, new_owner_id
from prorl_server.sandbox.apptainer import bare_exec_seconds
from prorl_server.sandbox.cgroups import detect
from prorl_server.sandbox.podman import podman_command, ulimit_args
from prorl_server.sandbox.reaper import reap, remove_owner_files, tagged_processes

TARGET_BWRAP_P50_MS = 50.0
TARGET_APPTAINER_RATIO = 1.2  # apptainer start-to-ready p50 / bare `apptainer exec IMAGE true` p50
BARE_APPTAINER = "apptainer exec IMAGE true"
DEFAULT_APPTAINER_IMAGE = os.environ.get("PRORL_APPTAINER_IMAGE", "/tmp/apptainer-test/images/py.sif")
TARGET_PODMAN_RATIO = 1.5  # podman start-to-ready p50 / bare `podman run --rm IMAGE true` p50
BARE_PODMAN = "podman run IMAGE true"
DEFAULT_PODMAN_IMAGE = os.environ.get("PRORL_PODMAN_IMAGE", "localhost/prorl-test:py")
BARES = {"apptainer": BARE_APPTAINER, "podman": BARE_PODMAN}


def bare_podman_seconds(image: str) -> float:
    """Wall time of one `podman run --rm IMAGE true` as the runtime runs it (no network, no log, its rlimits)."""
    argv = [*podman_command(), "run", "--rm", "--pull", "never", "--network", "none", "--log-driver", "none"]
    started = time.perf_counter()
    subprocess.run([*argv, *ulimit_args(), image, "true"], check=True, stdin=subprocess.DEVNULL, capture_output=True)
    return time.perf_counter() - started


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


async def part_start(
    variants: dict[str, tuple[Runtime, SandboxSpec]], starts: int, bares: dict[str, str] | None = None
) -> dict[str, Any]:
    """Sequential start-to-ready and close times; the variants take turns, so load changes hit all alike.

    `bares`: runtime -> image whose bare run takes its turn too (`apptainer exec IMAGE true`, `podman run
    --rm IMAGE true`: the baselines)."""
    bares = bares or {}
    ready: dict[str, list[float]] = {label: [] for label in variants}
    closing: dict[str, list[float]] = {label: [] for label in variants}
    for name in bares:
        ready[BARES[name]], closing[BARES[name]] = [], [0.0]
    for _ in range(starts):
        for label, (runtime, spec) in variants.items():
            started = time.perf_counter()
            sandbox = await runtime.start(spec)
            ready[label].append((time.perf_counter() - started) * 1000)
            started = time.perf_counter()
            await sandbox.close()
            closing[label].append((time.perf_counter() - started) * 1000)
            await asyncio.sleep(0.02)  # a quiet gap, as between jobs
        if "apptainer" in bares:
            ready[BARE_APPTAINER] += [1000 * t for t in bare_exec_seconds(bares["apptainer"], runs=1)]
            await asyncio.sleep(0.02)
        if "podman" in bares:
            ready[BARE_PODMAN].append(1000 * bare_podman_seconds(bares["podman"]))
            await asyncio.sleep(0.02)
    return {
        label: {
            "n": starts,
            "p50_ms": round(statistics.median(ready[label]), 1),
            "p99_ms": round(percentile_ms([t / 1000 for t in ready[label]], 99), 1),
            "min_ms": round(min(ready[label]), 1),
            "close_p50_ms": round(statistics.median(closing[label]), 1),
        }
        for label in ready
    }


def part_breakdown(owner: str, runs: int) -> dict[str, float]:
    """Where a bubblewrap start goes (see the module docstring)."""
    from prorl_server.sandbox.bwrap import BwrapRuntime
    from prorl_server.sandbox.slot import host_python_path

    runtime = BwrapRuntime(owner, prewarm=0)
    bwrap = median_ms([runtime._bwrap, *runtime.bwrap_args(SandboxSpec()), "--", "true"], runs)
    python = [sys.executable, "-I", "-S", "-c"]
    bare = median_ms([*python, "pass"], runs)
    imports = f"import sys; sys.path[:0] = {host_python_path()!r}; import prorl_server.tool_server.__main__"
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
    if "apptainer" in names and "apptainer" not in out["skipped"] and not os.path.exists(args.image["apptainer"]):
        out["skipped"]["apptainer"] = (
            f"no image at {args.image['apptainer']} (scripts/setup-apptainer.sh builds one; or --image apptainer=PATH)"
        )
    podman_image = args.image["podman"]
    exists = ["podman", "image", "exists", podman_image]
    if "podman" in names and "podman" not in out["skipped"] and subprocess.run(exists, capture_output=True).returncode:
        out["skipped"]["podman"] = (
            f"no image {podman_image} (scripts/setup-podman.sh imports one; or --image podman=REFERENCE)"
        )
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
        bare = {name: args.image[name] for name in BARES if name in names}
        print(f"part 1: {args.starts} sequential starts of {', '.join(variants)}", flush=True)
        await part_start(variants, min(5, args.starts), bare)  # warm the page cache
        out["start"] = await part_start(variants, args.starts, bare)
        for runtime, _ in variants.values():
            getattr(runtime, "close", lambda: None)()
        if "bwrap" in names:
            print("part 2: where a bubblewrap start goes", flush=True)
            out["breakdown"] = part_breakdown(new_owner_id(), args.starts)
        for name in names:
            count = args.concurrent_podman if name == "podman" else args.concurrent
            print(f"part 3: {count} {name} sandboxes at once", flush=True)
            runtime, owner = runtime_for(name)
            out["concurrent"][name] = await part_concurrent(runtime, owner, spec_for(name, args.image), count)
            getattr(runtime, "close", lambda: None)()
    finally:
        for owner in owners:
            reap(owner=owner)
            remove_owner_files(owner)
    out["checks"] = build_checks(out["start"])
    return out


def build_checks(start: dict[str, Any]) -> list[dict[str, Any]]:
    """The targets: bubblewrap p50; Apptainer and Podman p50 against their bare runs in the same run."""
    bwrap = start.get("bwrap")
    checks = [
        check(
            "bwrap start-to-ready p50 (ms)",
            bwrap["p50_ms"] if bwrap else None,
            "",
            f"<= {TARGET_BWRAP_P50_MS:.0f}",
            None if bwrap is None else bwrap["p50_ms"] <= TARGET_BWRAP_P50_MS,
        )
    ]
    for name, target in (("apptainer", TARGET_APPTAINER_RATIO), ("podman", TARGET_PODMAN_RATIO)):
        runtime, bare = start.get(name), start.get(BARES[name])
        if runtime and bare:
            ratio = runtime["p50_ms"] / bare["p50_ms"]
            checks.append(
                check(
                    f"{name} start-to-ready p50 / bare run p50",
                    f"{ratio:.2f}x ({runtime['p50_ms']:.0f} ms)",
                    f"{BARES[name]}: {bare['p50_ms']:.0f} ms",
                    f"<= {target}x",
                    ratio <= target,
                )
            )
    return checks


def print_report(out: dict[str, Any]) -> None:
    """Human-readable tables."""
    print("\nStart-to-ready, one at a time (ms)")
    print(f"  {'runtime':<28}{'n':>5}{'p50':>9}{'p99':>9}{'min':>9}{'close p50':>11}")
    for label, f in out["start"].items():
        close = f"{f['close_p50_ms']:>11.1f}" if label not in BARES.values() else f"{'':>11}"
        print(f"  {label:<28}{f['n']:>5}{f['p50_ms']:>9.1f}{f['p99_ms']:>9.1f}{f['min_ms']:>9.1f}{close}")
    breakdown = out.get("breakdown")
    if breakdown:
        print("\nWhere a bubblewrap start goes (medians, ms)")
        rows = (
            ("bwrap <options> true", "bwrap_true_ms"),
            ("python -I -S -c pass", "python_bare_ms"),
            ("execution server imports", "tools_imports_ms"),
            ("cgroup v1 join after quiet", "cgroup_join_after_quiet_ms"),
        )
        for label, key in rows:
            print(f"  {label:<28}{breakdown[key]:>9.1f}")
    if out["concurrent"]:
        print("\nMany at once")
        print(
            f"  {'runtime':<12}{'n':>5}{'start all s':>13}{'PSS MB/sbx':>12}{'MemAvail MB/sbx':>17}"
            f"{'procs/sbx':>11}{'close all s':>13}{'left':>6}"
        )
        for name, f in out["concurrent"].items():
            print(
                f"  {name:<12}{f['n']:>5}{f['start_all_s']:>13.2f}{f['pss_mb_per_sandbox']:>12.1f}"
                f"{f['mem_available_drop_mb_per_sandbox']:>17.1f}{f['processes_per_sandbox']:>11.1f}"
                f"{f['close_all_s']:>13.2f}{f['leftovers']:>6}"
            )
    for name, reason in out["skipped"].items():
        print(f"\nskipped {name}: {reason}")
    print_checks(out["checks"])


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line options."""
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    parser.add_argument("--json", type=Path, help="write the figures to this file")
    parser.add_argument("--runtimes", default="bwrap,local,apptainer,podman", help="comma-separated runtime names")
    parser.add_argument("--starts", type=int, default=100, help="part 1: sequential starts per runtime")
    parser.add_argument("--concurrent", type=int, default=200, help="part 3: sandboxes started at once")
    parser.add_argument("--concurrent-podman", type=int, default=20, help="part 3: podman sandboxes started at once")
    parser.add_argument(
        "--image",
        action="append",
        default=[],
        metavar="RUNTIME=PATH",
        help="image for a runtime's sandboxes (apptainer and podman need one; defaults: $PRORL_APPTAINER_IMAGE or "
        f"{DEFAULT_APPTAINER_IMAGE}, $PRORL_PODMAN_IMAGE or {DEFAULT_PODMAN_IMAGE})",
    )
    args = parser.parse_args(argv)
    defaults = {"apptainer": DEFAULT_APPTAINER_IMAGE, "podman": DEFAULT_PODMAN_IMAGE}
    args.image = {**defaults, **dict(item.split("=", 1) for item in args.image)}
    return args


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark, print the tables, optionally write JSON."""
    logging.basicConfig(level=logging.ERROR)
    args = parse_args(argv)
    started = time.monotonic()
    failures: dict[str, str] = {}
    try:
        out = asyncio.run(run(args))
    except Exception as exc:  # a part that cannot run at all
        out = {"start": {}, "concurrent": {}, "skipped": {}, "checks": []}
        failures["run"] = f"{type(exc).__name__}: {exc}"
    out["elapsed_s"] = time.monotonic() - started
    print_report(out)
    return finish(out, failures, args.json, None)


if __name__ == "__main__":
    sys.exit(main())

"""Benchmark: a Harbor task's image built cold and cached, and a sandbox of it started, per runtime.

Run it from the repository root::

    .venv/bin/python benchmarks/bench_images.py [--json out.json] [--task count-lines] [--starts 10]

One to three minutes on a 2-core machine with the defaults, nearly all of it the cold Apptainer build. The task is one of examples/harbor-tasks/; its
`FROM debian:bookworm` is mapped to a local root directory (`--base`, default the one
scripts/setup-apptainer.sh makes), so no registry or mirror is needed. What is not installed here is skipped
with the reason. Other work on the machine skews the figures: the 1-minute load average at start is kept.

Part 1 - the task's image (its environment/Dockerfile)
    apptainer: what the `harbor` handler does (convert, `apptainer build`, unpack to a root directory) into a
    fresh cache directory: cold, then again: cached (found by its key). podman: `podman build` with FROM
    mapped to the base imported into podman's storage (`build-image --runtime podman`): cold (its image
    removed first), then cached; the base's import (`podman import`, its image removed first) is a row of its
    own. The baseline of each cold build is its cached build, measured in the same run.
Part 2 - start-to-ready of a sandbox of the task's image (its WORKDIR, default limits), `--starts` times per
    variant, the variants taking turns: bwrap and apptainer on the unpacked root directory, podman on the
    same directory (`--rootfs`) and on the podman-built image. Baselines in the same run: a bare
    `apptainer exec ROOT true` and a bare `podman run --rm IMAGE true`.

JSON output (`--json PATH`); times in seconds for builds, milliseconds for starts::

    {
      "machine": {"cpus", "python", "load_avg_1m_at_start"},
      "config": {every command-line option},
      "build": {"apptainer" | "podman" | "podman base import": {"cold_s", "cached_s"}},
      "start": {variant or baseline label: {"n", "p50_ms", "p99_ms", "min_ms"}},
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
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from _report import check, children_run_this_checkout, finish, percentile_ms, positive_int, print_checks, report_header
from bench_sandbox import BARE_APPTAINER, BARE_PODMAN, bare_podman_seconds
from prorl_handlers.harbor.image import build as build_task_image
from prorl_handlers.harbor.task import load_task

from prorl_server.imaging import DEFAULTS, ImageBuilder
from prorl_server.imaging.podman_images import build_dockerfile, import_rootfs
from prorl_server.sandbox import Runtime, SandboxSpec, available, make_runtime, new_owner_id
from prorl_server.sandbox.apptainer import bare_exec_seconds, find_apptainer
from prorl_server.sandbox.reaper import reap, remove_owner_files

ROOT = Path(__file__).resolve().parent.parent
TASKS = ROOT / "examples" / "harbor-tasks"
DEFAULT_BASE = Path("/tmp/apptainer-test/imgroot")
FROM = "debian:bookworm"


def timed(function: Any, *args: Any, **kwargs: Any) -> tuple[Any, float]:
    """`function(*args, **kwargs)` and the seconds it took."""
    started = time.perf_counter()
    result = function(*args, **kwargs)
    return result, time.perf_counter() - started


def remove_image(reference: str) -> None:
    """`podman rmi` an image, if it is there."""
    subprocess.run(["podman", "rmi", "--ignore", "-f", reference], capture_output=True, check=True)


def part_build(args: argparse.Namespace, cache_dir: Path, names: list[str]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Cold and cached builds; returns the figures and what part 2 starts from (root dir, workdir, image)."""
    task = load_task(TASKS, args.task, oracle=True)
    figures: dict[str, Any] = {}
    made: dict[str, Any] = {}
    base_map = {FROM: args.base}
    if "apptainer" in names:
        print(f"part 1: apptainer build of {args.task} (cold, then cached)", flush=True)
        builder = ImageBuilder(cache_dir=cache_dir)
        image, cold = timed(build_task_image, builder, task, base_map, DEFAULTS["mirror"])
        again, cached = timed(build_task_image, builder, task, base_map, DEFAULTS["mirror"])
        assert not image.cached and again.cached, "the first build must be cold and the second cached"
        figures["apptainer"] = {"cold_s": round(cold, 2), "cached_s": round(cached, 3)}
        made.update(root=str(image.root), workdir=image.workdir)
    if "podman" in names:
        print(f"part 1: podman build of {args.task} (cold, then cached)", flush=True)
        base = import_rootfs(args.base)
        remove_image(base.reference)
        base, import_cold = timed(import_rootfs, args.base)
        _, import_cached = timed(import_rootfs, args.base)
        figures["podman base import"] = {"cold_s": round(import_cold, 2), "cached_s": round(import_cached, 3)}
        dockerfile, context = task.dockerfile, task.dockerfile.parent
        remove_image(build_dockerfile(dockerfile, context, base_map=base_map, cache_dir=cache_dir).reference)
        image, cold = timed(build_dockerfile, dockerfile, context, base_map=base_map, cache_dir=cache_dir)
        again, cached = timed(build_dockerfile, dockerfile, context, base_map=base_map, cache_dir=cache_dir)
        assert not image.cached and again.cached, "the first build must be cold and the second cached"
        figures["podman"] = {"cold_s": round(cold, 2), "cached_s": round(cached, 3)}
        made.update(podman_image=image.reference, podman_workdir=image.workdir)
    return figures, made


async def part_start(variants: dict[str, tuple[Runtime, SandboxSpec]], bares: dict[str, Any], starts: int) -> dict:
    """Sequential start-to-ready times, the variants and the bare runs taking turns."""
    ready: dict[str, list[float]] = {label: [] for label in [*variants, *bares]}
    for _ in range(starts):
        for label, (runtime, spec) in variants.items():
            started = time.perf_counter()
            sandbox = await runtime.start(spec)
            ready[label].append(time.perf_counter() - started)
            await sandbox.close()
            await asyncio.sleep(0.02)
        for label, run in bares.items():
            ready[label].append(run())
            await asyncio.sleep(0.02)
    return {
        label: {
            "n": len(times),
            "p50_ms": round(1000 * statistics.median(times), 1),
            "p99_ms": round(percentile_ms(times, 99), 1),
            "min_ms": round(1000 * min(times), 1),
        }
        for label, times in ready.items()
    }


async def run(args: argparse.Namespace) -> dict[str, Any]:
    """Both parts; returns the JSON document."""
    out: dict[str, Any] = {**report_header(args), "build": {}, "start": {}}
    reasons = available()
    names = ["bwrap", "apptainer", "podman"]
    out["skipped"] = {name: reasons[name] for name in names if reasons[name] is not None}
    if not (args.base / "usr/bin/python3").exists():
        out["skipped"] = {name: f"no base root directory at {args.base} (scripts/setup-apptainer.sh)" for name in names}
    names = [n for n in names if n not in out["skipped"]]
    owners: list[str] = []
    with tempfile.TemporaryDirectory(prefix="bench-images-", dir="/var/tmp") as cache:
        out["build"], made = part_build(args, Path(cache), names)
        variants: dict[str, tuple[Runtime, SandboxSpec]] = {}
        for name in names:
            owners.append(new_owner_id())
            runtime = make_runtime(name, owners[-1])
            if "root" in made:
                variants[f"{name} (root directory)"] = (
                    runtime,
                    SandboxSpec(image=made["root"], workdir=made["workdir"]),
                )
            if name == "podman":
                image = SandboxSpec(image=made["podman_image"], workdir=made["podman_workdir"])
                variants["podman (podman-built image)"] = (runtime, image)
        bares: dict[str, Any] = {}
        if "apptainer" in names:
            bares[BARE_APPTAINER] = lambda: bare_exec_seconds(made["root"], runs=1, binary=find_apptainer())[0]
        if "podman" in names:
            bares[BARE_PODMAN] = lambda: bare_podman_seconds(made["podman_image"])
        print(f"part 2: {args.starts} starts of {', '.join([*variants, *bares])}", flush=True)
        try:
            out["start"] = await part_start(variants, bares, args.starts)
        finally:
            for runtime in {id(r): r for r, _ in variants.values()}.values():
                runtime.close()
            for owner in owners:
                reap(owner=owner)
                remove_owner_files(owner)
    out["checks"] = build_checks(out)
    return out


def build_checks(out: dict[str, Any]) -> list[dict[str, Any]]:
    """Cold builds against cached ones; podman starts against the bare podman run (figures, no targets)."""
    rows = [
        check(f"{name} build cold (s)", f["cold_s"], f"cached: {f['cached_s']} s", "", None)
        for name, f in out["build"].items()
    ]
    start, bare = out["start"], out["start"].get(BARE_PODMAN)
    for label in ("podman (root directory)", "podman (podman-built image)"):
        if label in start and bare:
            ratio = start[label]["p50_ms"] / bare["p50_ms"]
            rows.append(
                check(
                    f"{label} start p50 / bare run p50",
                    f"{ratio:.2f}x ({start[label]['p50_ms']:.0f} ms)",
                    f"{BARE_PODMAN}: {bare['p50_ms']:.0f} ms",
                    "",
                    None,
                )
            )
    return rows


def print_report(out: dict[str, Any]) -> None:
    """Human-readable tables."""
    print("\nImage build (s)")
    print(f"  {'runtime':<22}{'cold':>9}{'cached':>9}")
    for name, f in out["build"].items():
        print(f"  {name:<22}{f['cold_s']:>9.2f}{f['cached_s']:>9.3f}")
    print("\nStart-to-ready, one at a time (ms)")
    print(f"  {'variant':<32}{'n':>5}{'p50':>9}{'p99':>9}{'min':>9}")
    for label, f in out["start"].items():
        print(f"  {label:<32}{f['n']:>5}{f['p50_ms']:>9.1f}{f['p99_ms']:>9.1f}{f['min_ms']:>9.1f}")
    for name, reason in out["skipped"].items():
        print(f"\nskipped {name}: {reason}")
    print_checks(out["checks"])


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line options."""
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    parser.add_argument("--json", type=Path, help="write the figures to this file")
    parser.add_argument("--task", default="count-lines", help="a task folder of examples/harbor-tasks/")
    parser.add_argument("--base", type=Path, default=DEFAULT_BASE, help=f"root directory {FROM} is mapped to")
    parser.add_argument("--starts", type=positive_int, default=10, help="part 2: sequential starts per variant")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark, print the tables, optionally write JSON."""
    logging.basicConfig(level=logging.ERROR)
    children_run_this_checkout()
    args = parse_args(argv)
    started = time.monotonic()
    failures: dict[str, str] = {}
    try:
        out = asyncio.run(run(args))
    except Exception as exc:  # a part that cannot run at all
        out = {"build": {}, "start": {}, "skipped": {}, "checks": []}
        failures["run"] = f"{type(exc).__name__}: {exc}"
    out["elapsed_s"] = time.monotonic() - started
    print_report(out)
    return finish(out, failures, args.json, None)


if __name__ == "__main__":
    raise SystemExit(main())

"""Benchmark: the in-sandbox execution server against a tmux-driven shell and a fresh `bash -c` per command.

Run it from the repository root::

    .venv/bin/python benchmarks/bench_tools.py [--json out.json]

About a minute on a 2-core machine with the defaults. Everything runs on this machine, no sandbox: the
execution server (`python -m prorl_server.tool_server`) is a subprocess on a Unix socket in a private temporary
directory and is driven through the real host client (`ToolClient`, asyncio). Other work on the machine
skews the figures: the 1-minute load average at start is printed and kept.

Bash round trip: three commands (`true`, `echo hello`, and `yes hello | head -c 1000000`, 1 MB of output
returned in full: max_output is raised above 1 MB), timed from the caller's side, on four systems. Each
system's series runs in 4 rounds, with the systems' order rotating from round to round, so a change of
load hits all alike while each series stays in its steady state (`--warmup` untimed calls start each block):
    - prorl: `ToolClient.bash` -> Unix socket -> server thread -> persistent bash on a pty (ptyprocess).
    - pty: the floor of any shell on a pseudo-terminal: bash started as the execution server starts it, driven
      from the benchmark's process by a bare write-then-read-to-a-marker loop (no script file, socket, JSON,
      capping or cleaning). The terminal's line discipline hands the reader at most 4 KiB per read.
    - tmux: the conventional tmux-driven shell: a persistent bash in a detached tmux session on a private
      tmux server (`-L`, killed at the end) with a large history; per command `send-keys` of the command
      followed by `echo __EC__$?` and `tmux wait-for -S <channel>`, then `tmux wait-for <channel>` (blocks
      until the command ran: no polling delay, the best case of this method), `capture-pane -p -J -S - -E -`
      and `clear-history`.
    - subprocess: `subprocess.run(["bash", "-c", cmd], capture_output=True)`, a fresh shell per command
      (no state kept between commands; the floor of what a non-persistent runner costs).
Targets: bash `true` <= 2 ms p50 and >= 20x faster than tmux; 1 MB of output within 2x of the raw subprocess
(`bash -c`, a pipe) in the same run.
IPython round trip: `1+1` through `ToolClient.ipython` (kernel already started; its start-up, the first
call, is reported apart).
Start-up: time from spawning the server to its answer to a `ping` on a fresh connection, with the client
polling connect() every 0.5 ms, next to `python -c pass` (the interpreter's floor) and to `python -c
"import socket, json, threading"` (the floor of a standard-library JSON socket server; the execution
server starts on C modules only and must beat it: tools/wire.py). All run with
PYTHONPYCACHEPREFIX set to a directory warmed first, so compiled bytecode is present, as in a deployment
that precompiles the package (`python -m compileall`); without .pyc files each start also compiles
prorl_server's modules.

JSON output (`--json PATH`); times in milliseconds::

    {
      "machine": {"cpus", "python", "platform", "tmux", "load_avg_1m_at_start"},
      "config": {every command-line option},
      "elapsed_s": wall time of the whole benchmark,
      "bash": {
        "true" | "echo" | "1mb": {
          "prorl" | "pty" | "tmux" | "subprocess": {"n", "p50_ms", "p99_ms", "mean_ms"}
        }
      },
      "speedup": {"true" | "echo" | "1mb": {"vs_tmux", "vs_subprocess"}},   # p50 of the other / p50 prorl
      "ipython": {"kernel_start_ms", "one_plus_one": {"n", "p50_ms", "p99_ms", "mean_ms"}},
      "startup": {"python_floor": {"n", "p50_ms", "p99_ms", "mean_ms"},    # python -c pass
                  "stdlib_floor": {...},     # python -c "import socket, json, threading"
                  "server_to_ping": {...}},
      "checks": [{"metric", "value", "baseline", "target", "pass"}],  # the summary table; pass is
                                                                     # true/false, or null without target
      "failures": {part: error message},           # parts that could not run (normally empty)
      "left_behind": [PIDs of child processes still alive at the end]   # normally empty
    }

The exit code is 0 whatever the figures (this is a measurement, not a test); it is 1 only when a part
could not run at all (its error is printed and kept under "failures").
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import platform
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from _report import check, finish, percentile_ms, positive_int, print_checks

from prorl_server.tool_server.client import ToolClient
from prorl_server.tool_server.protocol import SOCKET_NAME

TARGET_TRUE_P50_MS = 2.0
TARGET_SPEEDUP_VS_TMUX = 20.0
TARGET_1MB_VS_SUBPROCESS = 2.0  # bash with 1 MB of output, p50: prorl / a fresh `bash -c` (raw subprocess)
ONE_MB = 1_000_000
COMMANDS = {"true": "true", "echo": "echo hello", "1mb": f"yes hello | head -c {ONE_MB}"}
EXPECTED_OUTPUT = {"true": 0, "echo": len("hello\n"), "1mb": ONE_MB}  # characters of output
SYSTEMS = ("prorl", "pty", "tmux", "subprocess")
ROUNDS = 4  # each system's series is split in rounds, the order of systems rotating between rounds

# ------------------------------------------------------------------------------------------------
# Figures
# ------------------------------------------------------------------------------------------------


def summary(values: list[float]) -> dict[str, Any]:
    """n, p50, p99 and mean of durations in seconds, as milliseconds."""
    return {
        "n": len(values),
        "p50_ms": percentile_ms(values, 50),
        "p99_ms": percentile_ms(values, 99),
        "mean_ms": 1000 * statistics.fmean(values) if values else float("nan"),
    }


# ------------------------------------------------------------------------------------------------
# The four shells
# ------------------------------------------------------------------------------------------------


class ExecutionServer:
    """`python -m prorl_server.tool_server` on a socket in a private directory, stopped by close()."""

    def __init__(self, env: dict[str, str] | None = None) -> None:
        self.base = Path(tempfile.mkdtemp(prefix="bench-tools-"))
        self.socket_path = str(self.base / SOCKET_NAME)
        env = {**(env or os.environ), "TMPDIR": str(self.base)}  # its private files go away with `base`
        self.started = time.perf_counter()
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "prorl_server.tool_server",
                "--socket",
                self.socket_path,
                "--workdir",
                str(self.base),
            ],
            stdout=subprocess.DEVNULL,
            env=env,
        )

    def first_ping_s(self) -> float:
        """Seconds from spawn to the first answered ping (blocking socket, connect polled every 0.5 ms)."""
        deadline = time.monotonic() + 30
        while True:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
                try:
                    sock.connect(self.socket_path)
                except OSError:
                    if time.monotonic() > deadline or self.process.poll() is not None:
                        raise RuntimeError("the execution server did not start") from None
                    time.sleep(0.0005)
                    continue
                sock.sendall(b'{"id":1,"action":"ping"}\n')
                if b'"ok":true' not in sock.recv(4096):
                    raise RuntimeError("ping was not answered")
                return time.perf_counter() - self.started

    def close(self) -> None:
        """Shut the server down (SIGTERM, then SIGKILL) and remove its directory."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        shutil.rmtree(self.base, ignore_errors=True)


class TmuxShell:
    """A persistent bash in a detached session of a private tmux server, driven the conventional way."""

    def __init__(self, workdir: str) -> None:
        self.name = f"prorl-bench-{os.getpid()}"
        self.config = Path(workdir) / "tmux.conf"
        self.config.write_text("set -g history-limit 500000\nset -g status off\n")
        self.tmux = ["tmux", "-L", self.name, "-f", str(self.config)]
        self.sequence = 0
        shell = "bash --noprofile --norc"
        self._tmux("new-session", "-d", "-s", "bench", "-x", "250", "-y", "50", "-c", workdir, shell)

    def run(self, command: str) -> str:
        """Run a command; returns the captured pane (screen and history)."""
        self.sequence += 1
        channel = f"done-{self.sequence}"
        line = f"{command}; echo __EC__$?; tmux -L {self.name} wait-for -S {channel}"
        self._tmux("send-keys", "-t", "bench", line, "Enter")
        self._tmux("wait-for", channel)
        pane = self._tmux("capture-pane", "-p", "-J", "-t", "bench", "-S", "-", "-E", "-")
        self._tmux("clear-history", "-t", "bench")
        return pane

    def close(self) -> None:
        """Kill the private tmux server."""
        subprocess.run([*self.tmux, "kill-server"], capture_output=True)

    def _tmux(self, *args: str) -> str:
        return subprocess.run([*self.tmux, *args], capture_output=True, text=True, check=True).stdout


class PtyShell:
    """The floor of a persistent shell on a pseudo-terminal: bash started as the execution server starts it
    (tools/bash.py: same argv, environment and `stty -onlcr`), driven from this process by a bare loop that
    writes the command with an end marker and reads the terminal (64 KiB reads) until the marker. No script
    file, no socket, no JSON, no output capping or cleaning: what any pty-based shell pays."""

    def __init__(self, workdir: str) -> None:
        from ptyprocess import PtyProcess

        from prorl_server.tool_server.bash import DIMENSIONS, SHELL_ARGV, SHELL_ENV, SHELL_INIT, default_signals

        env = dict(os.environ, **SHELL_ENV)
        self.proc = PtyProcess.spawn(
            SHELL_ARGV, cwd=workdir, env=env, echo=False, dimensions=DIMENSIONS, preexec_fn=default_signals
        )
        self.sequence = 0
        self.run(SHELL_INIT)

    def run(self, command: str) -> str:
        """Run a command; returns its output (the marker cut off)."""
        self.sequence += 1
        marker = f"__pty_done_{self.sequence}__".encode()
        os.write(self.proc.fd, f"{command}; printf '__pty_done_%d__' {self.sequence}\n".encode())
        buffer = bytearray()
        while True:
            buffer += os.read(self.proc.fd, 1 << 16)
            end = buffer.find(marker, max(0, len(buffer) - (1 << 16) - len(marker)))
            if end >= 0:
                return buffer[:end].decode()

    def close(self) -> None:
        """Kill the shell."""
        self.proc.terminate(force=True)


def run_fresh_bash(command: str) -> str:
    """A new `bash -c` per command."""
    return subprocess.run(["bash", "-c", command], capture_output=True, text=True, check=True).stdout


# ------------------------------------------------------------------------------------------------
# Parts
# ------------------------------------------------------------------------------------------------


async def part_bash_and_ipython(args: argparse.Namespace) -> dict[str, Any]:
    """Interleaved bash round trips on the four systems, then IPython round trips."""
    server = ExecutionServer()
    tmux: TmuxShell | None = None
    pty: PtyShell | None = None
    client = ToolClient(server.socket_path)
    try:
        await client.wait_ready(timeout=30)
        tmux = TmuxShell(str(server.base))
        pty = PtyShell(str(server.base))
        prorl_max_output = 2 * ONE_MB

        async def prorl(command: str) -> str:
            return (await client.bash(command, max_output=prorl_max_output)).output

        def check(key: str, system: str, output: str) -> None:
            if system == "tmux":  # the pane shows the typed line and the prompt: check the marker only
                ok = "__EC__0" in output and (key != "1mb" or output.count("hello") >= ONE_MB // 6)
            else:
                ok = len(output) == EXPECTED_OUTPUT[key]
            if not ok:
                raise RuntimeError(f"{system} gave unexpected output for {COMMANDS[key]!r}: {output[:200]!r}")

        times: dict[str, dict[str, list[float]]] = {key: {s: [] for s in SYSTEMS} for key in COMMANDS}
        for key, command in COMMANDS.items():
            reps = args.reps_1mb if key == "1mb" else args.reps
            for round_ in range(ROUNDS):
                order = SYSTEMS[round_ % len(SYSTEMS) :] + SYSTEMS[: round_ % len(SYSTEMS)]
                for system in order:
                    for rep in range(args.warmup + reps // ROUNDS + (round_ < reps % ROUNDS)):
                        started = time.perf_counter()
                        if system == "prorl":
                            output = await prorl(command)
                        elif system == "tmux":
                            output = tmux.run(command)
                        elif system == "pty":
                            output = pty.run(command)
                        else:
                            output = run_fresh_bash(command)
                        elapsed = time.perf_counter() - started
                        check(key, system, output)
                        if rep >= args.warmup:
                            times[key][system].append(elapsed)
            print(f"  bash {command!r}: done", flush=True)
        bash = {key: {s: summary(v) for s, v in per.items()} for key, per in times.items()}

        started = time.perf_counter()
        first = await client.ipython("1+1", timeout=120)
        kernel_start_ms = 1000 * (time.perf_counter() - started)
        if first.output != "2\n":
            raise RuntimeError(f"ipython 1+1 gave {first.output!r}")
        cell_times = []
        for rep in range(args.reps + args.warmup):
            started = time.perf_counter()
            await client.ipython("1+1")
            if rep >= args.warmup:
                cell_times.append(time.perf_counter() - started)
        print("  ipython '1+1': done", flush=True)
        await client.shutdown()
        server.process.wait(10)
        return {
            "bash": bash,
            "ipython": {"kernel_start_ms": kernel_start_ms, "one_plus_one": summary(cell_times)},
        }
    finally:
        await client.aclose()
        if tmux is not None:
            tmux.close()
        if pty is not None:
            pty.close()
        server.close()


def part_startup(args: argparse.Namespace) -> dict[str, Any]:
    """Spawn-to-ping of the server next to `python -c pass`, bytecode cached in a warmed prefix."""
    with warmed_pycache() as env:
        floors = {
            "python_floor": [sys.executable, "-c", "pass"],
            "stdlib_floor": [sys.executable, "-c", "import socket, json, threading"],
        }
        figures: dict[str, list[float]] = {"python_floor": [], "stdlib_floor": [], "server_to_ping": []}
        for _ in range(args.starts):  # interleaved, so a change of load hits all three alike
            for key, command in floors.items():
                figures[key].append(timed_run(command, env))
            server = ExecutionServer(env)
            try:
                figures["server_to_ping"].append(server.first_ping_s())
            finally:
                server.close()
    print("  start-up: done", flush=True)
    return {key: summary(values) for key, values in figures.items()}


@contextlib.contextmanager
def warmed_pycache() -> Iterator[dict[str, str]]:
    """An environment whose PYTHONPYCACHEPREFIX holds the bytecode of everything the server imports."""
    prefix = tempfile.mkdtemp(prefix="bench-pycache-")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPYCACHEPREFIX"] = prefix
    try:
        warm = ExecutionServer(env)  # imports and byte-compiles what a start needs
        try:
            warm.first_ping_s()
        finally:
            warm.close()
        yield env
    finally:
        shutil.rmtree(prefix, ignore_errors=True)


def timed_run(command: list[str], env: dict[str, str]) -> float:
    """Seconds a command takes to run to its end."""
    started = time.perf_counter()
    subprocess.run(command, env=env, check=True)
    return time.perf_counter() - started


# ------------------------------------------------------------------------------------------------
# Report
# ------------------------------------------------------------------------------------------------


def build_checks(report: dict[str, Any]) -> list[dict[str, Any]]:
    """The rows of the final table; `pass` is None for figures without a target."""
    rows: list[dict[str, Any]] = []
    bash = report.get("bash")
    if bash:
        t = bash["true"]
        rows.append(
            check(
                "bash `true` p50 (prorl)",
                f"{t['prorl']['p50_ms']:.2f} ms",
                f"tmux {t['tmux']['p50_ms']:.1f} ms, bash -c {t['subprocess']['p50_ms']:.1f} ms",
                f"<= {TARGET_TRUE_P50_MS:g} ms",
                t["prorl"]["p50_ms"] <= TARGET_TRUE_P50_MS,
            )
        )
        for key in COMMANDS:
            speedup = report["speedup"][key]["vs_tmux"]
            has_target = key != "1mb"
            rows.append(
                check(
                    f"speedup vs tmux, {COMMANDS[key].split(' |')[0] if key != '1mb' else '1 MB output'} p50",
                    f"{speedup:.1f}x",
                    f"prorl {bash[key]['prorl']['p50_ms']:.2f} ms vs tmux {bash[key]['tmux']['p50_ms']:.1f} ms",
                    f">= {TARGET_SPEEDUP_VS_TMUX:g}x" if has_target else "-",
                    speedup >= TARGET_SPEEDUP_VS_TMUX if has_target else None,
                )
            )
        one_mb = bash["1mb"]
        ratio = one_mb["prorl"]["p50_ms"] / one_mb["subprocess"]["p50_ms"]
        rows.append(
            check(
                "1 MB output p50 vs raw subprocess (bash -c)",
                f"{ratio:.2f}x ({one_mb['prorl']['p50_ms']:.1f} ms)",
                f"bash -c {one_mb['subprocess']['p50_ms']:.1f} ms",
                f"<= {TARGET_1MB_VS_SUBPROCESS:g}x",
                ratio <= TARGET_1MB_VS_SUBPROCESS,
            )
        )
        floor = one_mb["pty"]["p50_ms"]
        rows.append(
            check(
                "  of which a bare pty shell (the floor) vs raw subprocess",
                f"{floor / one_mb['subprocess']['p50_ms']:.2f}x ({floor:.1f} ms)",
                f"prorl adds {one_mb['prorl']['p50_ms'] - floor:.1f} ms to it",
                "-",
                None,
            )
        )
    ipython = report.get("ipython")
    if ipython:
        cell = ipython["one_plus_one"]
        rows.append(check("ipython `1+1` p50", f"{cell['p50_ms']:.2f} ms", f"p99 {cell['p99_ms']:.2f} ms", "-", None))
    startup = report.get("startup")
    if startup:
        s, floor, stdlib = startup["server_to_ping"], startup["python_floor"], startup["stdlib_floor"]
        rows.append(
            check(
                "server spawn -> ping p50",
                f"{s['p50_ms']:.1f} ms",
                f"python -c pass {floor['p50_ms']:.1f} ms, + socket/json/threading {stdlib['p50_ms']:.1f} ms",
                "< python + socket/json/threading",  # the server's start-up beats importing what it avoids
                s["p50_ms"] < stdlib["p50_ms"],
            )
        )
    return rows


def print_report(report: dict[str, Any]) -> None:
    """Human-readable tables."""
    bash = report.get("bash")
    if bash:
        print("\nBash round trip, caller's view (ms)")
        print(f"  {'command':<30}{'system':<12}{'n':>5}{'p50':>10}{'p99':>10}{'mean':>10}")
        for key, per in bash.items():
            for system, f in per.items():
                label = COMMANDS[key] if system == "prorl" else ""
                print(
                    f"  {label:<30}{system:<12}{f['n']:>5}{f['p50_ms']:>10.2f}{f['p99_ms']:>10.2f}{f['mean_ms']:>10.2f}"
                )
    ipython = report.get("ipython")
    if ipython:
        cell = ipython["one_plus_one"]
        print(f"\nIPython round trip `1+1` (ms), kernel start-up (first call) {ipython['kernel_start_ms']:.0f} ms")
        print(f"  {'n':>5}{'p50':>10}{'p99':>10}{'mean':>10}")
        print(f"  {cell['n']:>5}{cell['p50_ms']:>10.2f}{cell['p99_ms']:>10.2f}{cell['mean_ms']:>10.2f}")
    startup = report.get("startup")
    if startup:
        print("\nStart-up (ms; bytecode cached)")
        print(f"  {'':<40}{'n':>5}{'p50':>10}{'p99':>10}")
        rows = (
            ("server spawn -> ping", "server_to_ping"),
            ("python: import socket, json, threading", "stdlib_floor"),
            ("python -c pass", "python_floor"),
        )
        for label, key in rows:
            f = startup[key]
            print(f"  {label:<40}{f['n']:>5}{f['p50_ms']:>10.1f}{f['p99_ms']:>10.1f}")
    print_checks(report["checks"])


def children_alive() -> list[int]:
    """PIDs of this process's children that still run (zombies excluded)."""
    me = os.getpid()
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        with contextlib.suppress(OSError):
            stat = Path(f"/proc/{name}/stat").read_text()
            fields = stat[stat.rfind(")") + 2 :].split()
            if int(fields[1]) == me and fields[0] != "Z":
                found.append(int(name))
    return found


# ------------------------------------------------------------------------------------------------
# Main
# ------------------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line options."""

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--reps", type=positive_int, default=200, help="repetitions of `true`, `echo`, `1+1`")
    parser.add_argument("--reps-1mb", type=positive_int, default=10, help="repetitions of the 1 MB command")
    parser.add_argument("--warmup", type=int, default=3, help="untimed repetitions before each series")
    parser.add_argument("--starts", type=positive_int, default=20, help="server start-ups timed")
    parser.add_argument("--json", type=Path, help="also write the figures to this file")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; returns 0 whatever the figures, 1 only when a part could not run at all."""
    args = parse_args(argv)
    tmux_version = subprocess.run(["tmux", "-V"], capture_output=True, text=True).stdout.strip()
    report: dict[str, Any] = {
        "machine": {
            "cpus": os.cpu_count(),
            "python": sys.version.split()[0],
            "platform": platform.platform(),
            "tmux": tmux_version,
            "load_avg_1m_at_start": os.getloadavg()[0],
        },
        "config": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
    }
    print(
        f"prorl-server tools benchmark: {os.cpu_count()} CPUs, Python {sys.version.split()[0]}, {tmux_version}, "
        f"load average {os.getloadavg()[0]:.2f} (other work on the machine skews the figures)",
        flush=True,
    )
    started = time.monotonic()
    failures: dict[str, str] = {}
    try:
        report.update(asyncio.run(part_bash_and_ipython(args)))
        report["speedup"] = {
            key: {
                "vs_tmux": per["tmux"]["p50_ms"] / per["prorl"]["p50_ms"],
                "vs_subprocess": per["subprocess"]["p50_ms"] / per["prorl"]["p50_ms"],
            }
            for key, per in report["bash"].items()
        }
    except Exception as exc:  # report it, go on with the other part
        failures["bash_ipython"] = f"{type(exc).__name__}: {exc}"
    try:
        report["startup"] = part_startup(args)
    except Exception as exc:
        failures["startup"] = f"{type(exc).__name__}: {exc}"
    report["checks"] = build_checks(report)
    report["elapsed_s"] = time.monotonic() - started
    report["failures"] = failures
    report["left_behind"] = children_alive()
    print_report(report)
    leftovers = f"child processes {report['left_behind']}" if report["left_behind"] else None
    return finish(report, failures, args.json, leftovers)


if __name__ == "__main__":
    sys.exit(main())

"""`prorl-server vllm start|stop|status`: the real vLLM (CPU build) from `scripts/setup-vllm.sh`, by port.

`start` runs vLLM in the background (its PID and log under `<home>/run/`), waits for `GET /health` and
prints the address; `--foreground` runs it in this process instead (for Slurm or a supervisor). `stop`
signals only the process that `start` recorded, after checking that the PID still is that vLLM.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

from prorl_server.vllm_cpu.install import VllmCpuInstall, VllmNotInstalled, unsupported_reason
from prorl_server.vllm_cpu.launcher import (
    MAIN_SCRIPT,
    READY_TIMEOUT_S,
    VllmCpuSettings,
    VllmStartError,
    is_healthy,
    stop_session,
    tail,
    vllm_command,
    vllm_environment,
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """`start`, `stop` and `status`, each with the port it concerns."""
    defaults = VllmCpuSettings()
    actions = parser.add_subparsers(dest="vllm_action", required=True)
    start = actions.add_parser(
        "start", help="start vLLM and wait until it is healthy", formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    start.add_argument("--host", default=defaults.host)
    start.add_argument("--port", type=int, default=defaults.port)
    start.add_argument("--served-model-name", default=defaults.served_model_name)
    start.add_argument("--max-model-len", type=int, default=defaults.max_model_len)
    start.add_argument("--max-num-seqs", type=int, default=None, help="requests running at once (vLLM's default)")
    start.add_argument(
        "--scheduling-policy", choices=["priority", "fcfs"], default=defaults.scheduling_policy, help="queue order"
    )
    start.add_argument(
        "--kv-cache-gib", type=int, default=defaults.kv_cache_gib, help="KV cache in whole GiB (VLLM_CPU_KVCACHE_SPACE)"
    )
    start.add_argument(
        "--weight-reload",
        action="store_true",
        help="enable the endpoints POST /weights/update's `reload` calls (VLLM_SERVER_DEV_MODE=1: vLLM's "
        "development endpoints, which anyone reaching the port may call)",
    )
    start.add_argument("--timeout", type=float, default=READY_TIMEOUT_S, help="seconds to wait for health")
    start.add_argument("--foreground", action="store_true", help="run vLLM in this process (no PID file)")
    start.add_argument("--print-command", action="store_true", help="print the vLLM command and exit")
    start.add_argument("extra", nargs=argparse.REMAINDER, help="after --: more `vllm serve` flags")
    for name, text in (("stop", "stop the vLLM that `start` began on a port"), ("status", "is it running and healthy")):
        action = actions.add_parser(name, help=text)
        action.add_argument("--port", type=int, default=defaults.port)
        action.add_argument("--host", default=defaults.host)


def run_from_args(args: argparse.Namespace) -> None:
    """Carry out the parsed action; problems end the process with a message (exit code 1)."""
    install = VllmCpuInstall.default()
    try:
        if args.vllm_action == "start":
            start(install, args)
        elif args.vllm_action == "stop":
            stop(install, args.port)
        else:
            status(install, args.host, args.port)
    except (VllmNotInstalled, VllmStartError) as exc:
        sys.exit(f"prorl-server vllm: {exc}")


def run_dir(install: VllmCpuInstall) -> Path:
    """Where `start` keeps its PID files and logs."""
    return install.home / "run"


def pid_file(install: VllmCpuInstall, port: int) -> Path:
    return run_dir(install) / f"vllm-{port}.pid"


def recorded_pid(install: VllmCpuInstall, port: int) -> int | None:
    """The PID `start` recorded for `port`, if that process is still the vLLM it started."""
    try:
        pid = int(pid_file(install, port).read_text())
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except (OSError, ValueError):
        return None
    is_ours = os.fsencode(MAIN_SCRIPT) in cmdline and os.fsencode(str(port)) in cmdline
    return pid if is_ours else None


def settings_from(args: argparse.Namespace) -> VllmCpuSettings:
    extra = tuple(a for a in args.extra if a != "--")
    return VllmCpuSettings(
        host=args.host,
        port=args.port,
        served_model_name=args.served_model_name,
        max_model_len=args.max_model_len,
        scheduling_policy=args.scheduling_policy,
        max_num_seqs=args.max_num_seqs,
        kv_cache_gib=args.kv_cache_gib,
        weight_reload=getattr(args, "weight_reload", False),
        extra_args=extra,
    )


def start(install: VllmCpuInstall, args: argparse.Namespace) -> None:
    settings = settings_from(args)
    if args.print_command:
        print(" ".join(vllm_command(install, settings)))
        return
    reason = unsupported_reason()
    if reason:
        raise VllmNotInstalled(reason + "; use the dev engine instead: prorl-server dev-llm")
    install.require()
    argv, env = vllm_command(install, settings), vllm_environment(settings)
    if args.foreground:
        os.execve(argv[0], argv, env)
    pid = recorded_pid(install, settings.port)
    if pid is not None:
        print(f"vLLM already running on port {settings.port} (pid {pid}): {settings.address}")
        return
    run_dir(install).mkdir(parents=True, exist_ok=True)
    log = run_dir(install) / f"vllm-{settings.port}.log"
    print(f"starting vLLM {settings.served_model_name} on {settings.address} (usually 30-60 s on a CPU; log {log})")
    with log.open("wb") as out:
        proc = subprocess.Popen(
            argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env, start_new_session=True
        )
    pid_file(install, settings.port).write_text(str(proc.pid))
    started = time.monotonic()
    base_url = f"http://{settings.host}:{settings.port}"
    next_report = 10.0
    while not is_healthy(base_url):
        elapsed = time.monotonic() - started
        if proc.poll() is not None:
            pid_file(install, settings.port).unlink(missing_ok=True)
            raise VllmStartError(f"vLLM exited with code {proc.returncode}; the end of {log}:\n{tail(log)}")
        if elapsed > args.timeout:
            stop_session(proc.pid, lambda: proc.poll() is not None)
            pid_file(install, settings.port).unlink(missing_ok=True)
            raise VllmStartError(
                f"vLLM was not healthy after {args.timeout:.0f} s (stopped); the end of {log}:\n{tail(log)}"
            )
        if elapsed >= next_report:
            print(f"  still starting ({elapsed:.0f} s)", flush=True)
            next_report += 10
        time.sleep(0.5)
    print(f"vLLM ready on {settings.address} after {time.monotonic() - started:.1f} s (pid {proc.pid})")


def stop(install: VllmCpuInstall, port: int) -> None:
    pid = recorded_pid(install, port)
    pid_file(install, port).unlink(missing_ok=True)
    if pid is None:
        print(f"no vLLM started by `prorl-server vllm start` is running on port {port}")
        return
    stop_session(pid, lambda: not Path(f"/proc/{pid}").exists() or _is_zombie(pid))
    print(f"stopped vLLM on port {port} (pid {pid})")


def status(install: VllmCpuInstall, host: str, port: int) -> None:
    pid = recorded_pid(install, port)
    healthy = is_healthy(f"http://{host}:{port}")
    problem = install.missing()
    print(f"installation: {install.home} ({problem or 'complete'})")
    print(
        f"port {port}: " + (f"pid {pid}" if pid else "not started here") + (", healthy" if healthy else ", not healthy")
    )
    if not healthy:
        sys.exit(1)


def _is_zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return True

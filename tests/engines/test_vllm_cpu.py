"""`prorl_server.vllm_cpu` and `prorl-server vllm start|stop|status`: the real vLLM on a CPU, started and
stopped by PID with the settings that work there."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from prorl_server.testing.uvicorn_thread import free_port
from prorl_server.vllm_cpu import VllmCpuInstall, VllmCpuSettings, unsupported_reason, vllm_command
from prorl_server.vllm_cpu.launcher import vllm_environment

CLI = [sys.executable, "-m", "prorl_server.cli", "vllm"]


def run_cli(*args: str, home: Path | None = None, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    if home is not None:
        env["PRORL_VLLM_HOME"] = str(home)
    return subprocess.run([*CLI, *args], capture_output=True, text=True, env=env, timeout=timeout)


def test_the_command_carries_the_cpu_settings(tmp_path):
    settings = VllmCpuSettings(port=9123, max_num_seqs=3, extra_args=("--seed", "1"))
    argv = vllm_command(VllmCpuInstall(tmp_path), settings)
    assert argv[0] == str(tmp_path / "venv" / "bin" / "python")
    assert argv[2:4] == ["serve", str(tmp_path / "models" / "smollm2-135m-instruct")]
    joined = " ".join(argv)
    for flag in ("--enforce-eager", "--dtype float32", "--scheduling-policy priority", "--max-model-len 4096"):
        assert flag in joined
    assert "--port 9123" in joined and "--max-num-seqs 3" in joined and joined.endswith("--seed 1")
    env = vllm_environment(settings, base={})
    assert env["VLLM_CPU_KVCACHE_SPACE"] == "1" and env["HF_HUB_OFFLINE"] == "1"


def test_a_missing_installation_names_the_setup_command(tmp_path):
    assert "scripts/setup-vllm.sh" in VllmCpuInstall(tmp_path).missing()
    result = run_cli("start", "--port", str(free_port()), home=tmp_path)
    assert result.returncode == 1
    assert "setup-vllm.sh" in result.stderr or "x86_64" in result.stderr


def test_stop_signals_only_the_vllm_it_started(tmp_path):
    """A PID file naming some other process (a stale file, a reused PID) is not acted on."""
    bystander = subprocess.Popen(["sleep", "60"])
    try:
        port = free_port()
        (tmp_path / "run").mkdir()
        (tmp_path / "run" / f"vllm-{port}.pid").write_text(str(bystander.pid))
        result = run_cli("stop", "--port", str(port), home=tmp_path)
        assert result.returncode == 0 and "no vLLM started" in result.stdout
        assert bystander.poll() is None
    finally:
        bystander.kill()
        bystander.wait()


def test_status_of_a_port_without_vllm_fails(tmp_path):
    result = run_cli("status", "--port", str(free_port()), home=tmp_path)
    assert result.returncode == 1 and "not healthy" in result.stdout


def test_start_status_and_stop_a_real_vllm():
    problem = unsupported_reason() or VllmCpuInstall.default().missing()
    if problem:
        if os.environ.get("PRORL_REQUIRE_VLLM") == "1":
            pytest.fail(problem)
        pytest.skip(f"the real vLLM is not available here: {problem}")
    port = free_port()
    try:  # stopped whatever happens, a start that timed out too (its engine may be up by now)
        started = run_cli("start", "--port", str(port), "--max-num-seqs", "2", "--kv-cache-gib", "1", timeout=330)
        assert started.returncode == 0, started.stdout + started.stderr
        assert f"vLLM ready on http://127.0.0.1:{port}/v1" in started.stdout
        pid = int((VllmCpuInstall.default().home / "run" / f"vllm-{port}.pid").read_text())
        assert run_cli("status", "--port", str(port)).returncode == 0
        again = run_cli("start", "--port", str(port))
        assert "already running" in again.stdout
        body = {"model": "SmolLM2-135M-Instruct", "prompt": "Hello", "max_tokens": 2}
        answer = httpx.post(f"http://127.0.0.1:{port}/v1/completions", json=body, timeout=60, trust_env=False)
        assert answer.status_code == 200
    finally:
        stopped = run_cli("stop", "--port", str(port), timeout=60)
    assert stopped.returncode == 0 and f"pid {pid}" in stopped.stdout
    assert not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text().split(")")[-1][:3]
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"http://127.0.0.1:{port}/health", timeout=5, trust_env=False)


def test_print_command_shows_the_vllm_command_line(tmp_path):
    result = run_cli(
        "start", "--port", "9321", "--max-num-seqs", "2", "--print-command", "--", "--seed", "7", home=tmp_path
    )
    assert result.returncode == 0, result.stderr
    argv = result.stdout.split()
    assert argv[0] == str(tmp_path / "venv" / "bin" / "python") and argv[1].endswith("vllm_main.py")
    assert argv[2] == "serve" and "--enforce-eager" in argv and argv[-2:] == ["--seed", "7"]
    assert argv[argv.index("--port") + 1] == "9321" and argv[argv.index("--max-num-seqs") + 1] == "2"

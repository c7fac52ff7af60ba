"""`prorl-server serve` as a process: flags, handler by file, SIGTERM stops gracefully and exits."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
from repo_paths import TESTS
from serve_process import start_serve, stop, wait_healthy

from prorl_server.auth_key import auth_headers
from prorl_server.cli import API_KEY_ENV, reachable_beyond_loopback
from prorl_server.testing.uvicorn_thread import free_port


def test_serve_runs_jobs_and_sigterm_cancels_in_flight_then_exits(backend):
    port = free_port()
    exe = shutil.which("prorl-server") or str(Path(sys.executable).parent / "prorl-server")
    cmd = [
        exe, "serve", "--port", str(port), "--init-workers", "2", "--run-workers", "3", "--eval-workers", "1",
        "--llm-server", backend.address, "--handler", f"{TESTS / 'handlers_for_tests.py'}:SlowStageHandler",
        "--no-entry-points", "--log-level", "warning",
    ]  # fmt: skip
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, proc)
        key = auth_headers()  # the server's: given none, it uses (and made) the session's key file (conftest.py)
        status = httpx.get(f"{url}/status", headers=key).json()
        assert status["workers"] == {"init": 2, "run": 3, "eval": 1}
        job = {"instance": {"data_source": "slow"}}
        assert httpx.post(f"{url}/process", json=job, headers=key).json()["status"] == "completed"

        backend.double.default_delay_s = 60
        got: dict = {}
        waiter = threading.Thread(
            target=lambda: got.update(
                httpx.post(f"{url}/process", json={"instance": {"data_source": "slow"}}, headers=key, timeout=60).json()
            )
        )
        waiter.start()
        deadline = time.monotonic() + 10
        while not any(r.outcome == "running" for r in backend.double.requests) and time.monotonic() < deadline:
            time.sleep(0.02)
        os.kill(proc.pid, signal.SIGTERM)
        waiter.join(20)
        assert got.get("status") == "cancelled" and got["error"]["type"] == "ServerStopped"
        assert proc.wait(20) in (0, -signal.SIGTERM)  # uvicorn re-raises the signal after its graceful shutdown
        deadline = time.monotonic() + 5
        while any(r.outcome == "running" for r in backend.double.requests) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert not any(r.outcome == "running" for r in backend.double.requests)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


def test_serve_exits_with_a_clear_message_on_a_bad_handler():
    exe = shutil.which("prorl-server") or str(Path(sys.executable).parent / "prorl-server")
    done = subprocess.run(
        [exe, "serve", "--port", str(free_port()), "--handler", "nosuchmod:X"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode != 0
    assert "cannot import 'nosuchmod'" in done.stderr


def test_serve_refuses_a_sandbox_dir_too_long_for_unix_socket_paths(tmp_path):
    exe = shutil.which("prorl-server") or str(Path(sys.executable).parent / "prorl-server")
    too_long = tmp_path / ("d" * 60)
    done = subprocess.run(
        [exe, "serve", "--port", str(free_port()), "--runtime", "local", "--sandbox-dir", str(too_long)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode != 0
    assert f"sandboxes' directory {too_long}/prorl-sandboxes-{os.geteuid()} is too long" in done.stderr
    assert "bytes shorter (serve: --sandbox-dir)" in done.stderr


def test_serve_takes_the_api_key_from_the_environment_and_requires_it(tmp_path, backend):
    env = {**os.environ, API_KEY_ENV: "cli-test-key"}
    proc, url, log = start_serve(tmp_path, env, "--host", "0.0.0.0", "--llm-server", backend.address)
    try:
        assert httpx.get(f"{url}/status").status_code == 401
        authed = {"authorization": "Bearer cli-test-key"}
        assert httpx.get(f"{url}/status", headers=authed).json()["llm_servers"] == 1
    finally:
        stop(proc)
    assert "NO API KEY" not in log.read_text()


def test_serve_warns_loudly_when_reachable_without_a_key(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != API_KEY_ENV}
    proc, url, log = start_serve(tmp_path, env, "--host", "0.0.0.0", "--no-api-key")
    try:
        assert httpx.get(f"{url}/status").status_code == 200
    finally:
        stop(proc)
    warning = log.read_text()
    assert "WARNING" in warning and "NO API KEY" in warning and "0.0.0.0" in warning and API_KEY_ENV in warning
    assert "--no-api-key" in warning


def test_only_loopback_hosts_count_as_private():
    for host in ("127.0.0.1", "127.0.0.2", "::1", "localhost"):
        assert not reachable_beyond_loopback(host), host
    for host in ("0.0.0.0", "::", "10.0.0.5", "192.168.1.2", "gpu-node-1"):
        assert reachable_beyond_loopback(host), host

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

from prorl_server.testing.uvicorn_thread import free_port

HERE = Path(__file__).parent


def wait_healthy(url: str, proc: subprocess.Popen, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.stderr.read() if proc.stderr else "server exited"
        try:
            if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            time.sleep(0.1)
    raise TimeoutError("server did not become healthy")


def test_serve_runs_jobs_and_sigterm_cancels_in_flight_then_exits(backend):
    port = free_port()
    exe = shutil.which("prorl-server") or str(Path(sys.executable).parent / "prorl-server")
    cmd = [
        exe, "serve", "--port", str(port), "--init-workers", "2", "--run-workers", "3", "--eval-workers", "1",
        "--llm-server", backend.address, "--handler", f"{HERE / 'handlers_for_tests.py'}:SlowStageHandler",
        "--no-entry-points", "--log-level", "warning",
    ]  # fmt: skip
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, proc)
        status = httpx.get(f"{url}/status").json()
        assert status["workers"] == {"init": 2, "run": 3, "eval": 1}
        assert httpx.post(f"{url}/process", json={"instance": {"data_source": "slow"}}).json()["status"] == "completed"

        backend.double.default_delay_s = 60
        got: dict = {}
        waiter = threading.Thread(
            target=lambda: got.update(
                httpx.post(f"{url}/process", json={"instance": {"data_source": "slow"}}, timeout=60).json()
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

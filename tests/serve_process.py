"""`prorl-server serve` as a child process of a test: started on a free port, waited for, stopped by pid."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path

import httpx

from prorl_server.testing.uvicorn_thread import free_port


def serve_executable() -> str:
    """The `prorl-server` console script of this environment."""
    return shutil.which("prorl-server") or str(Path(sys.executable).parent / "prorl-server")


def wait_healthy(url: str, proc: subprocess.Popen, timeout: float = 30) -> None:
    """Wait until `GET /health` answers; fails with the server's stderr when it exited instead."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.stderr.read() if proc.stderr else "server exited"
        try:
            if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            time.sleep(0.1)
    raise TimeoutError("server did not become healthy")


def start_serve(tmp_path: Path, env: dict[str, str] | None, *options: str) -> tuple[subprocess.Popen, str, Path]:
    """`prorl-server serve` on a free port with stderr to a file; returns the process, its URL and the log.
    Given no key (in `env` or `options`) nor --no-api-key, it uses the key of $PRORL_API_KEY_FILE (the test
    session's, conftest.py), which `prorl_server.auth_key.auth_headers()` sends."""
    port = free_port()
    log = tmp_path / f"serve-{port}.log"
    cmd = [serve_executable(), "serve", "--port", str(port), "--no-entry-points", "--runtime", "local"]
    with log.open("w") as err:
        proc = subprocess.Popen([*cmd, "--log-level", "warning", *options], stderr=err, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, proc)
    except BaseException:
        proc.kill()
        proc.wait(10)
        raise
    return proc, url, log


def stop(proc: subprocess.Popen) -> None:
    """SIGTERM (graceful), then SIGKILL if it does not exit within 20 s."""
    proc.terminate()
    try:
        proc.wait(20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)

"""A persistent IPython kernel: ipykernel in its own session, driven directly by a jupyter_client
BlockingKernelClient over ZeroMQ ipc sockets (no kernel gateway, no TCP ports).

The kernel is a separate process so a timeout can interrupt it (SIGINT -> KeyboardInterrupt) and a crash
or a runaway extension cannot take the execution server down; if an interrupt does not bring it back, it is
killed and a fresh kernel starts on the next call, which the output says. jupyter_client and ipykernel
are imported on first use; without them the action fails with IPythonUnavailable.
"""

from __future__ import annotations

import contextlib
import os
import queue
import signal
import subprocess
import sys
import threading
import time

from prorl_server.errors import ExecutionServerError
from prorl_server.tool_server.output import TextCapture, observation
from prorl_server.tool_server.processes import kill_session

TYPE_CHECKING = False  # not `typing.TYPE_CHECKING`: nothing imported that the server does not need
if TYPE_CHECKING:
    from collections.abc import Callable

START_TIMEOUT_S = 60.0
INTERRUPT_GRACE_S = 3.0  # after SIGINT, how long the kernel has to finish the cell
LIVENESS_CHECK_S = 0.5
KERNEL_ARGS = ["--HistoryManager.enabled=False", "--IPKernelApp.log_level=ERROR"]


class IPythonUnavailable(ExecutionServerError):
    """jupyter_client or ipykernel is missing, or the kernel did not start."""


class KernelDied(ExecutionServerError):
    """The kernel process exited."""


def import_jupyter_client() -> tuple[type, Callable[..., tuple[str, dict]]]:
    """jupyter_client's BlockingKernelClient and write_connection_file. A server started without `site` (-S,
    which saves every sandbox start the site-packages scan) adds the interpreter's site-packages first, on
    this first use, when they are not on sys.path yet."""
    try:
        from jupyter_client import BlockingKernelClient
        from jupyter_client.connect import write_connection_file
    except ImportError:
        if not sys.flags.no_site or "site" in sys.modules:
            raise
        import site

        site.main()
        from jupyter_client import BlockingKernelClient
        from jupyter_client.connect import write_connection_file
    return BlockingKernelClient, write_connection_file


class IPythonSession:
    """One persistent kernel; `run` calls are serialized."""

    def __init__(self, workdir: str, state_dir: str) -> None:
        self.workdir = workdir
        self.state_dir = state_dir
        self.lock = threading.Lock()
        self.process: subprocess.Popen[bytes] | None = None
        self.client = None  # jupyter_client.BlockingKernelClient while a kernel runs

    def run(self, code: str, timeout: float, max_output: int) -> dict[str, object]:
        """Execute `code`; waiting for an earlier cell counts against `timeout`, starting the kernel does not."""
        started = time.monotonic()
        if not self.lock.acquire(timeout=max(timeout, 0.0)):
            note = "[the kernel was busy with another cell for the whole timeout; this code did not run]"
            return observation(note, None, True, False, started)
        try:
            remaining = timeout - (time.monotonic() - started)
            if self.client is None:
                self._start()
            return self._execute(code, time.monotonic() + remaining, max_output, started)
        finally:
            self.lock.release()

    def close(self) -> None:
        """Kill the kernel and everything it started (safe to call from another thread, and twice)."""
        self._stop()

    def _execute(self, code: str, deadline: float, max_output: int, started: float) -> dict[str, object]:
        client = self.client
        while True:  # drop replies of earlier cells (not msg_ready(): a coroutine in jupyter_client 7)
            try:
                client.get_shell_msg(timeout=0)  # the getters are sync in jupyter_client 7 and 8 alike
            except queue.Empty:
                break
        msg_id = self.client.execute(code, allow_stdin=False, stop_on_error=False)
        capture = TextCapture(max_output)
        errors: list[str] = []
        note = ""
        timed_out = False
        try:
            finished = self._collect(msg_id, deadline, capture, errors)
            if not finished:
                timed_out = True
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.process.pid, signal.SIGINT)
                if not self._collect(msg_id, time.monotonic() + INTERRUPT_GRACE_S, capture, errors):
                    self._stop()
                    note = (
                        "\n[the cell did not stop on interrupt; the kernel was killed and the next call starts a "
                        "new one: variables and imports are lost]"
                    )
        except KernelDied:
            finished = False
            self._stop()
            note = "\n[the kernel died; the next call starts a new one: variables and imports are lost]"
        text, truncated = capture.text(max_output)
        exit_code = (1 if errors else 0) if finished and not timed_out else None
        result = observation(text + note, exit_code, timed_out, truncated, started)
        result["error_name"] = errors[-1] if errors else None
        return result

    def _collect(self, msg_id: str, deadline: float, capture: TextCapture, errors: list[str]) -> bool:
        """Gather the cell's output until the kernel goes idle (True) or `deadline` passes (False)."""
        client = self.client
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            try:
                msg = client.get_iopub_msg(timeout=min(remaining, LIVENESS_CHECK_S))
            except queue.Empty:
                if self.process.poll() is not None:
                    raise KernelDied from None
                continue
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            kind, content = msg["msg_type"], msg["content"]
            if kind == "stream":
                capture.feed(content["text"])
            elif kind in ("execute_result", "display_data"):
                text = content["data"].get("text/plain")
                capture.feed(f"{text}\n" if text is not None else f"[{kind} without text/plain]\n")
            elif kind == "error":
                capture.feed("\n".join(content["traceback"]) + "\n")
                errors.append(content["ename"])
            elif kind == "status" and content["execution_state"] == "idle":
                return True

    def _start(self) -> None:
        try:
            kernel_client, write_connection_file = import_jupyter_client()
        except ImportError as exc:
            raise IPythonUnavailable(
                f"IPython needs jupyter_client and ipykernel in the sandbox's Python ({sys.executable}): {exc}"
            ) from None
        os.makedirs(self.state_dir, exist_ok=True)
        connection_file, _ = write_connection_file(
            os.path.join(self.state_dir, "kernel.json"),
            transport="ipc",
            ip=os.path.join(self.state_dir, "kernel"),
            key=os.urandom(16).hex().encode(),
        )
        env = dict(
            os.environ,
            JPY_PARENT_PID=str(os.getpid()),  # the kernel exits when this server dies
            IPYTHONDIR=os.path.join(self.state_dir, "ipython"),
            JUPYTER_RUNTIME_DIR=os.path.join(self.state_dir, "runtime"),
            JUPYTER_PLATFORM_DIRS="1",
            MPLBACKEND="Agg",
            PYDEVD_DISABLE_FILE_VALIDATION="1",
        )
        log_path = os.path.join(self.state_dir, "kernel.log")
        with open(log_path, "wb") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "ipykernel_launcher", "-f", connection_file, *KERNEL_ARGS],
                cwd=self.workdir,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.client = kernel_client(connection_file=connection_file)
        self.client.load_connection_file()
        self.client.start_channels(shell=True, iopub=True, stdin=False, hb=False, control=False)
        if not self._wait_ready(time.monotonic() + START_TIMEOUT_S):
            self._stop()
            with open(log_path, errors="replace") as f:
                log_tail = f.read()[-2000:]
            raise IPythonUnavailable(f"the IPython kernel did not start within {START_TIMEOUT_S:.0f}s:\n{log_tail}")

    def _wait_ready(self, deadline: float) -> bool:
        """Ask for kernel_info until a reply's status arrives on iopub, proving both channels work."""
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                return False
            msg_id = self.client.kernel_info()
            with contextlib.suppress(KernelDied):
                if self._collect(msg_id, min(deadline, time.monotonic() + 1.0), TextCapture(0), []):
                    return True
        return False

    def _stop(self) -> None:
        process, client = self.process, self.client
        self.process = self.client = None
        if process is not None:
            kill_session(process.pid)
            process.wait()
        if client is not None:  # the kernel is gone: drop unsent messages (stop_channels() lingers 100 ms)
            client.context.destroy(linger=0)

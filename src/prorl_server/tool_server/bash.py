"""A persistent bash session on a pseudo-terminal (ptyprocess; no tmux).

Each command is written to a script file and sourced by the interactive shell with stdin from /dev/null,
followed by a marker carrying `$?`: cwd, variables and functions persist, multi-line commands and heredocs
need no quoting, and a command that reads stdin sees end-of-file instead of hanging. On timeout the
terminal gets Ctrl-C (SIGINT to the foreground job); if the shell does not answer a sync marker, the
foreground job is killed; if it still does not answer, the whole shell session is killed and a fresh
shell is started on the next command, which the output says.
"""

from __future__ import annotations

import contextlib
import os
import re
import select
import shlex
import signal
import threading
import time

from prorl_server.errors import ExecutionServerError
from prorl_server.tool_server.output import ByteCapture, observation
from prorl_server.tool_server.processes import kill_session

SHELL_ARGV = ["bash", "--noprofile", "--norc", "--noediting", "-i"]
SHELL_ENV = {  # no prompts, no pagers, no colours
    "PS1": "",
    "PS2": "",
    "PS0": "",
    "PROMPT_COMMAND": "",
    "TERM": "dumb",
    "PAGER": "cat",
    "GIT_PAGER": "cat",
    "MANPAGER": "cat",
    "SYSTEMD_PAGER": "",
}
SHELL_INIT = "stty -onlcr 2>/dev/null; set +o history; unset HISTFILE; PS1=; PS2=; PS0=; PROMPT_COMMAND="
DIMENSIONS = (40, 250)  # rows, columns of the terminal
START_TIMEOUT_S = 10.0
INTERRUPT_GRACE_S = 2.0  # after Ctrl-C, how long the shell has to come back
KILL_GRACE_S = 2.0  # after SIGKILL to the foreground job, how long the shell has to come back
LIVENESS_CHECK_S = 0.5  # while waiting for output, how often to check the shell is alive
READ_SIZE = 1 << 16


class ShellGone(ExecutionServerError):
    """The shell exited (end of file on the terminal)."""


def default_signals() -> None:
    """In the shell's process before exec: undo Python's ignored SIGPIPE (else `yes | head` complains)."""
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)


class BashSession:
    """One persistent interactive bash; `run` calls are serialized."""

    def __init__(self, workdir: str, state_dir: str) -> None:
        self.workdir = workdir
        self.script = os.path.join(state_dir, "command.sh")
        self.script_fd = -1  # kept open: rewriting in place is ~50x cheaper than open(O_TRUNC) on ext4
        self.lock = threading.Lock()
        self.proc = None  # ptyprocess.PtyProcess while a shell runs
        self.poller = select.poll()
        # End-of-command markers: a random token (output cannot fake it), a sequence number, the exit code.
        token = os.urandom(8).hex()
        self.marker_prefix = f"__prorl_done_{token}_"
        self.markers = re.compile(rb"__prorl_done_" + token.encode() + rb"_(\d+)_(\d+)__")
        self.stray_markers = re.compile(self.markers.pattern.decode())
        self.sequence = 0

    def run(self, command: str, timeout: float, max_output: int) -> dict[str, object]:
        """Run `command` in the shell; waiting for an earlier command counts against `timeout`."""
        started = time.monotonic()
        if not self.lock.acquire(timeout=max(timeout, 0.0)):
            note = "[the shell was busy with another command for the whole timeout; this command did not run]"
            return observation(note, None, True, False, started)
        try:
            return self._run(command, started + timeout, max_output, started)
        finally:
            self.lock.release()

    def close(self) -> None:
        """Kill the shell and everything it started (safe to call from another thread, and twice)."""
        self._stop()
        if self.script_fd >= 0:
            os.close(self.script_fd)
            self.script_fd = -1

    def _run(self, command: str, deadline: float, max_output: int, started: float) -> dict[str, object]:
        if self.proc is None:
            self._start()
        self._write_script(command.encode("utf-8", errors="replace"))
        sequence = self._send(f". {shlex.quote(self.script)} < /dev/null; ")
        capture = ByteCapture(max_output)
        exit_code: int | None = None
        timed_out = False
        note = ""
        try:
            match = self._read_until(sequence, deadline, capture)
            if match is not None:
                exit_code = int(match.group(2))
            else:
                timed_out = True
                note = self._interrupt(capture)
        except ShellGone:
            exit_code, note = self._gone()
        text, truncated = capture.text(max_output, remove=self.stray_markers)
        return observation(text + note, exit_code, timed_out, truncated, started)

    def _write_script(self, data: bytes) -> None:
        """Put the command in the script file (made again if someone deleted it)."""
        if self.script_fd < 0 or os.fstat(self.script_fd).st_nlink == 0:
            if self.script_fd >= 0:
                os.close(self.script_fd)
            os.makedirs(os.path.dirname(self.script), exist_ok=True)
            self.script_fd = os.open(self.script, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        os.pwrite(self.script_fd, data, 0)
        os.ftruncate(self.script_fd, len(data))

    def _start(self) -> None:
        from ptyprocess import PtyProcess

        env = dict(os.environ, **SHELL_ENV)
        self.proc = PtyProcess.spawn(
            SHELL_ARGV,
            cwd=self.workdir,
            env=env,
            echo=False,
            dimensions=DIMENSIONS,
            preexec_fn=default_signals,
        )
        self.poller = select.poll()
        self.poller.register(self.proc.fd, select.POLLIN)
        ready = self._send(SHELL_INIT + "; ")
        try:
            found = self._read_until(ready, time.monotonic() + START_TIMEOUT_S, ByteCapture(0))
        except ShellGone:
            found = None
        if found is None:
            self._stop()
            raise RuntimeError(f"bash did not start within {START_TIMEOUT_S:.0f}s in {self.workdir}")

    def _send(self, prefix: str) -> int:
        """Write one input line ending in a fresh marker that carries `$?`; return the marker's number."""
        self.sequence += 1
        self._write(f"{prefix}printf '{self.marker_prefix}{self.sequence}_%d__' $?\n".encode())
        return self.sequence

    def _write(self, data: bytes) -> None:
        """Write to the terminal; ShellGone if it is closed."""
        try:
            os.write(self.proc.fd, data)
        except OSError:
            raise ShellGone from None

    def _read_until(self, sequence: int, deadline: float, capture: ByteCapture) -> re.Match[bytes] | None:
        """Read terminal output into `capture` until marker number `sequence` appears (returned, and cut
        from the capture with what follows) or `deadline` passes (None). Raises ShellGone at end of file."""
        fd = self.proc.fd
        window = 64  # longer than any marker
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            if not self.poller.poll(min(remaining, LIVENESS_CHECK_S) * 1000):
                if not self.proc.isalive():
                    raise ShellGone
                continue
            try:
                chunk = os.read(fd, READ_SIZE)
            except OSError:
                raise ShellGone from None
            if not chunk:
                raise ShellGone
            capture.feed(chunk)
            recent = capture.last(len(chunk) + window)
            for match in self.markers.finditer(recent):
                if int(match.group(1)) == sequence:
                    capture.drop_last(len(recent) - match.start())
                    return match

    def _interrupt(self, capture: ByteCapture) -> str:
        """Stop a command past its deadline; returns a note for the output when the shell was lost."""
        self._write(b"\x03")
        synced = self._send("")
        if self._read_until(synced, time.monotonic() + INTERRUPT_GRACE_S, capture) is not None:
            return ""
        try:
            foreground = os.tcgetpgrp(self.proc.fd)
            if foreground != self.proc.pid:
                os.killpg(foreground, signal.SIGKILL)
        except OSError:  # no foreground job any more, or the terminal is gone
            pass
        if self._read_until(synced, time.monotonic() + KILL_GRACE_S, capture) is not None:
            return ""
        self._stop()
        return (
            "\n[the command did not stop on Ctrl-C nor SIGKILL; the shell was killed and the next command "
            f"starts a new one in {self.workdir}: working directory, variables and functions are reset]"
        )

    def _gone(self) -> tuple[int | None, str]:
        """The shell exited by itself: reap it; returns its exit status and a note for the output."""
        status = self._stop()
        return status, (
            f"\n[the shell exited (status {status}); the next command starts a new shell in {self.workdir}: "
            "working directory, variables and functions are reset]"
        )

    def _stop(self) -> int | None:
        """Kill the shell's session, reap the shell, close the terminal; returns the shell's exit status."""
        proc, self.proc = self.proc, None
        if proc is None:
            return None
        from ptyprocess import PtyProcessError

        kill_session(proc.pid)
        try:
            status = proc.wait()
        except (PtyProcessError, ChildProcessError):  # reaped by a call running concurrently with close()
            status = None
        proc.delayafterclose = 0
        with contextlib.suppress(PtyProcessError, OSError):
            proc.close()
        return status

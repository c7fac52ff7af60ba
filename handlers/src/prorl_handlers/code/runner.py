"""Runs INSIDE a sandbox: `python3 runner.py CONFIG.json` runs one program once per input, with limits.

CONFIG: {"program", "inputs", "time_limit_s", "memory_mb", "keep_bytes", "results"}. Each run gets the input
on stdin, a wall-clock limit, `RLIMIT_AS` of `memory_mb` and a cap on what it may write; its process group is
killed afterwards. `results` receives one record per input: {"status", "stdout", "stderr", "exit_code",
"seconds"}, status ok, time_limit, memory_limit, runtime_error, or skipped (inputs after the first time
limit are not run). Expected outputs never enter the sandbox: the host compares.
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable

MAX_WRITE_BYTES = 64 << 20  # RLIMIT_FSIZE: a program printing forever stops here
KEEP_STDERR = 1000


def limit(memory_mb: int, time_limit_s: float) -> Callable[[], None]:
    """The child's preexec hook: address space, CPU seconds and file size limits."""
    cpu = int(time_limit_s) + 1

    def apply() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (memory_mb << 20, memory_mb << 20))
        resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu))
        resource.setrlimit(resource.RLIMIT_FSIZE, (MAX_WRITE_BYTES, MAX_WRITE_BYTES))

    return apply


def run(program: str, stdin: str, time_limit_s: float, memory_mb: int, keep_bytes: int) -> dict:
    """One run of `program` on `stdin`."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        start = time.monotonic()
        proc = subprocess.Popen(
            [sys.executable, program],
            stdin=subprocess.PIPE,
            stdout=out,
            stderr=err,
            preexec_fn=limit(memory_mb, time_limit_s),
            process_group=0,
        )
        timed_out = False
        try:
            proc.communicate(stdin.encode(), timeout=time_limit_s)
        except subprocess.TimeoutExpired:
            timed_out = True
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        seconds = time.monotonic() - start
        out.seek(0)
        stdout = out.read(keep_bytes).decode(errors="replace")
        err.seek(max(0, err.seek(0, os.SEEK_END) - KEEP_STDERR))
        stderr = err.read().decode(errors="replace")
    code = proc.returncode
    if timed_out or code == -signal.SIGXCPU:
        status = "time_limit"
    elif code == 0:
        status = "ok"
    elif "MemoryError" in stderr or code == -signal.SIGKILL:  # RLIMIT_AS, or the sandbox's OOM killer
        status = "memory_limit"
    else:
        status = "runtime_error"
    return {"status": status, "stdout": stdout, "stderr": stderr, "exit_code": code, "seconds": round(seconds, 3)}


def main(path: str) -> None:
    """Run every input of the config in `path`; write the records to its `results` file."""
    with open(path, encoding="utf-8") as f:
        config = json.load(f)
    records: list[dict] = []
    for stdin in config["inputs"]:
        if records and records[-1]["status"] in ("time_limit", "skipped"):
            records.append({"status": "skipped", "stdout": "", "stderr": "", "exit_code": None, "seconds": 0.0})
            continue
        limits = (config["time_limit_s"], config["memory_mb"], config["keep_bytes"])
        records.append(run(config["program"], stdin, *limits))
    with open(config["results"], "w", encoding="utf-8") as f:
        json.dump(records, f)


if __name__ == "__main__":
    main(sys.argv[1])

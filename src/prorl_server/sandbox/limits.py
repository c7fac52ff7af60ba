"""How a sandbox's limits are applied to its processes: rlimits, cgroups, tmpfs sizes, a wall-clock watchdog.

- rlimits are set inside the sandbox by its first process, a tiny Python bootstrap (`BOOT_CODE`, or
  `boot_code()` with the settings inlined), before it runs the execution server; every process the sandbox
  starts inherits them. No `preexec_fn`.
- cgroups (pids, memory, cpu; see cgroups.py) are joined by a `/bin/sh` wrapper that writes its own PID to
  each `cgroup.procs` and then execs the runtime (`join_cgroups_argv`), so nothing runs outside them.
- Disk is a size-limited tmpfs per writable mount (the runtime's job); RLIMIT_FSIZE caps a single file.
- Wall clock: `Watchdog` kills a sandbox's processes when its lifetime is over.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path

from prorl_server.sandbox.spec import SandboxLimits

log = logging.getLogger(__name__)

MB = 1024 * 1024


def rlimits(limits: SandboxLimits, nproc: bool) -> dict[str, int]:
    """RLIMIT name -> value for `resource.setrlimit` (soft = hard). Core dumps are always off.

    `nproc`: also cap processes with RLIMIT_NPROC. Only meaningful inside a user namespace created by an
    unprivileged user (there it counts that sandbox's processes); for root it is never enforced, and
    outside a user namespace it would count every process of the user on the host.
    """
    out = {"RLIMIT_CORE": 0}
    if limits.memory_mb is not None:
        out["RLIMIT_AS"] = limits.memory_mb * MB
    if limits.file_size_mb is not None:
        out["RLIMIT_FSIZE"] = limits.file_size_mb * MB
    if limits.cpu_seconds is not None:
        out["RLIMIT_CPU"] = limits.cpu_seconds
    if nproc and limits.pids is not None:
        out["RLIMIT_NPROC"] = limits.pids
    return out


ENV_BOOT = "PRORL_BOOT"  # BOOT_CODE's settings, a Python literal; removed from the environment at once

# Runs with `python -I -S -c` (or `-I`) as a sandbox's first process: set the rlimits; run `pre` (Landlock and
# seccomp, see confinement.py), closing any descriptor it was given first thing; with `user` (a sandbox
# a root server started without a user namespace) give the writable mounts to that uid and become it, for
# good (no capability survives the switch); then do what `python -m prorl_server.tool_server ARGV` does (without
# the runpy import, several ms), or idle. Standard library only and any Python 3: it runs with the
# interpreter inside the sandbox.
_BOOT_BODY = """\
for n, v in c["rlimits"]:
    k = getattr(r, n); h = r.getrlimit(k)[1]
    v = v if h == r.RLIM_INFINITY else min(v, h)
    r.setrlimit(k, (v, v))
if c.get("pre"):
    exec(c["pre"], {})
if c.get("user"):
    u, paths = c["user"]
    for p in paths: os.chown(p, u, u)
    os.setgroups([]); os.setresgid(u, u, u); os.setresuid(u, u, u)
if c["argv"] is None:
    import signal
    while True: signal.pause()
sys.path[:0] = c["path"]
sys.argv = ["-m", *c["argv"]]
from prorl_server.tool_server.__main__ import main
sys.exit(main())
"""
# The same source for every sandbox, settings in $PRORL_BOOT: a launcher can exec it before its spec is known.
BOOT_CODE = 'import os, sys, resource as r\nc = eval(os.environ.pop("PRORL_BOOT"))\n' + _BOOT_BODY


def boot_settings(
    limits: dict[str, int],
    sys_path: list[str],
    argv: list[str] | None,
    user: tuple[int, list[str]] | None = None,
    pre: str | None = None,
) -> str:
    """BOOT_CODE's settings: rlimits (a hard limit already lower is kept), entries put first on sys.path,
    the execution server's arguments (None: no server, idle), the uid to become after giving it the
    listed paths (None: stay), and source to run right after the rlimits (confinement.boot_source)."""
    settings = {"rlimits": sorted(limits.items()), "path": sys_path, "argv": argv, "user": user, "pre": pre}
    return repr(settings)


def boot_code(limits: dict[str, int], sys_path: list[str], argv: list[str] | None) -> str:
    """BOOT_CODE with its settings inlined, for a runtime that passes the command whole."""
    return f"import os, sys, resource as r\nc = {boot_settings(limits, sys_path, argv)}\n{_BOOT_BODY}"


JOIN_SCRIPT = 'while [ "$1" != -- ]; do echo $$ > "$1" || exit 125; shift; done; shift; exec "$@"'


def join_cgroups_argv(procs_files: list[Path], argv: list[str]) -> list[str]:
    """`argv` wrapped so that the process joins the given cgroups before it execs (unchanged if none)."""
    if not procs_files:
        return argv
    return ["/bin/sh", "-c", JOIN_SCRIPT, "sh", *map(str, procs_files), "--", *argv]


class Watchdog:
    """One daemon thread that calls each registered callback when its deadline passes.

    Callbacks run on the watchdog thread and must be quick and thread-safe (e.g. signal a process group).
    The thread starts with the first deadline and exits when none is left.
    """

    def __init__(self) -> None:
        self._heap: list[tuple[float, int]] = []
        self._callbacks: dict[int, Callable[[], None]] = {}
        self._ids = itertools.count()
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None

    def add(self, seconds: float, callback: Callable[[], None]) -> int:
        """Call `callback` in `seconds`; returns a handle for `cancel`."""
        with self._cond:
            handle = next(self._ids)
            self._callbacks[handle] = callback
            heapq.heappush(self._heap, (time.monotonic() + seconds, handle))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="sandbox-watchdog", daemon=True)
                self._thread.start()
            self._cond.notify()
        return handle

    def cancel(self, handle: int) -> None:
        """Forget a deadline (no-op if it already fired)."""
        with self._cond:
            self._callbacks.pop(handle, None)

    def _run(self) -> None:
        while True:
            with self._cond:
                while self._heap and self._heap[0][1] not in self._callbacks:
                    heapq.heappop(self._heap)
                if not self._heap:
                    self._thread = None
                    return
                deadline, handle = self._heap[0]
                delay = deadline - time.monotonic()
                if delay > 0:
                    self._cond.wait(delay)
                    continue
                heapq.heappop(self._heap)
                callback = self._callbacks.pop(handle)
            try:
                callback()
            except Exception:
                log.exception("sandbox watchdog callback failed")

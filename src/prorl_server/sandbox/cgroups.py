"""Per-sandbox cgroups (v1 or v2) for the pids, memory and CPU limits, where this process may create them.

Sandbox cgroups live under the server's own cgroup in each hierarchy, at `<own>/prorl/<owner>/<sandbox>`,
so they count against whatever limits the server itself runs under. A hierarchy that is missing or not
writable is skipped with one logged note; the limit it would enforce is then not enforced (docs/sandboxes.md).

The cpuset controller is joined only on request (`detect(cpuset=True)`: the action scheduler pins each action's
cores, cpu_grants.py); a v1 cpuset cgroup starts with the cores and memory nodes of its parent.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

from prorl_server.sandbox.spec import SandboxLimits

log = logging.getLogger(__name__)

CONTROLLERS = ("pids", "memory", "cpu")
CPUSET = "cpuset"
CPU_PERIOD_US = 100_000
MIN_CPU_QUOTA_US = 1_000  # the kernel refuses a smaller quota


@dataclass(frozen=True)
class Hierarchy:
    """Where sandbox cgroups of one controller go (for v2, one hierarchy serves every controller)."""

    version: int
    controllers: tuple[str, ...]
    base: Path  # <mount>/<own cgroup>/prorl


def _mounts() -> list[tuple[str, str, str]]:
    """(mount root, mount point, fstype and super options) of every cgroup mount."""
    found = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            head, _, tail = line.partition(" - ")
            fields, tail_fields = head.split(), tail.split()
            if tail_fields and tail_fields[0] in ("cgroup", "cgroup2"):
                found.append((fields[3], fields[4], f"{tail_fields[0]} {tail_fields[-1]}"))
    return found


def _own_paths() -> dict[str, str]:
    """This process's cgroup path per v1 controller, and under "" for v2."""
    paths = {}
    with open("/proc/self/cgroup") as f:
        for line in f:
            _, controllers, path = line.rstrip("\n").split(":", 2)
            for name in controllers.split(",") if controllers else [""]:
                paths[name] = path
    return paths


def _inside(mount_root: str, mount_point: str, path: str) -> Path | None:
    """The directory of cgroup `path` under a mount whose root is `mount_root`, if it is visible."""
    if mount_root != "/" and not (path == mount_root or path.startswith(mount_root + "/")):
        return None
    rel = path[len(mount_root) :] if mount_root != "/" else path
    return Path(mount_point) / rel.lstrip("/")


def _enable(directory: Path, controllers: tuple[str, ...]) -> tuple[str, ...]:
    """v2: turn on `controllers` for the children of `directory`; returns those that are on."""
    control = directory / "cgroup.subtree_control"
    for name in controllers:
        with contextlib.suppress(OSError):
            control.write_text(f"+{name}")
    return tuple(name for name in controllers if name in control.read_text().split())


def _inherit_cpuset(directory: Path) -> None:
    """v1: give an empty cpuset cgroup its parent's cores and memory nodes (no process may join it before)."""
    for name in ("cpuset.cpus", "cpuset.mems"):
        path = directory / name
        if path.exists() and not path.read_text().strip():
            path.write_text((directory.parent / name).read_text())


def detect(warn: bool = True, cpuset: bool = False) -> list[Hierarchy]:
    """The writable hierarchies for pids, memory and cpu (and cpuset if asked); logs a note for each of the
    first three without one."""
    own = _own_paths()
    found: list[Hierarchy] = []
    controllers = (*CONTROLLERS, CPUSET) if cpuset else CONTROLLERS
    for root, point, options in _mounts():
        fstype, opts = options.split(" ", 1)
        covered = {c for h in found for c in h.controllers}
        wanted = tuple(c for c in controllers if c not in covered and (fstype == "cgroup2" or c in opts.split(",")))
        key = "" if fstype == "cgroup2" else (wanted[0] if wanted else None)
        if not wanted or key not in own or (directory := _inside(root, point, own[key])) is None:
            continue
        try:
            if fstype == "cgroup2":
                available = (directory / "cgroup.controllers").read_text().split()
                wanted = _enable(directory, tuple(c for c in wanted if c in available))
                if not wanted:
                    continue
            base = directory / "prorl"
            base.mkdir(exist_ok=True)
            if fstype == "cgroup2":
                wanted = _enable(base, wanted)
            else:
                _inherit_cpuset(base)
        except OSError as exc:
            log.info("cgroup %s at %s is not usable (%s)", ",".join(wanted), directory, exc)
            continue
        found.append(Hierarchy(1 if fstype == "cgroup" else 2, wanted, base))
    covered = {c for h in found for c in h.controllers}
    for name in CONTROLLERS:
        if warn and name not in covered:
            log.warning(
                "no writable %s cgroup: sandbox %s limits fall back to rlimits or are not enforced "
                "(docs/sandboxes.md, 'Limits')",
                name,
                {"pids": "process-count", "memory": "total-memory", "cpu": "CPU-share"}[name],
            )
    return found


def _zombie(pid: int) -> bool:
    """True if the process has exited and only waits to be reaped (or is gone)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] in (b"Z", b"X")
    except (OSError, IndexError):
        return True


class SandboxCgroup:
    """The cgroup directories of one sandbox: join, inspect, kill everything in them, remove."""

    def __init__(self, directories: list[Path]) -> None:
        self.directories = directories

    @property
    def procs_files(self) -> list[Path]:
        """Files a process writes its PID to in order to join (before it starts anything)."""
        return [d / "cgroup.procs" for d in self.directories]

    def pids(self) -> set[int]:
        """Every process in the sandbox's cgroups."""
        found: set[int] = set()
        for directory in self.directories:
            with contextlib.suppress(OSError):
                found.update(int(p) for p in (directory / "cgroup.procs").read_text().split())
        return found

    def read(self, name: str) -> str | None:
        """A control file such as `pids.max` or `memory.oom_control`, from whichever directory has it."""
        for directory in self.directories:
            with contextlib.suppress(OSError):
                return (directory / name).read_text()
        return None

    def write(self, values: dict[str, str]) -> None:
        """Write control files, each in whichever directories have it, in order; OSError if a write fails."""
        for directory in self.directories:
            for name, value in values.items():
                path = directory / name
                if path.exists():
                    path.write_text(value)

    def apply(self, limits: SandboxLimits) -> None:
        """Write the limits (a failed write is logged, not fatal); members already inside are bound at once."""
        for directory in self.directories:
            for name, value in _settings(limits).items():
                path = directory / name
                if path.exists():
                    try:
                        path.write_text(value)
                    except OSError as exc:
                        log.warning("cannot set %s=%s: %s", path, value, exc)

    def kill(self, timeout_s: float = 5.0) -> None:
        """SIGKILL every member until none is left (members may fork while being killed; zombies count as gone)."""
        deadline = time.monotonic() + timeout_s
        delay = 0.001
        while pids := {p for p in self.pids() if not _zombie(p)}:
            for pid in pids:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
            if time.monotonic() > deadline:
                log.error("processes %s survive SIGKILL in sandbox cgroups", sorted(pids))
                return
            time.sleep(delay)
            delay = min(delay * 2, 0.05)

    def remove(self, timeout_s: float = 15.0) -> None:
        """Remove the (emptied) directories; members still exiting (or zombies not yet reaped) are waited for.

        A killed member whose parent died with it is reaped by the node's init, which can take seconds on a
        loaded machine; until then its cgroup cannot be removed (callers run this off the event loop)."""
        deadline = time.monotonic() + timeout_s
        for directory in self.directories:
            while True:
                try:
                    directory.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError as exc:
                    if time.monotonic() > deadline:
                        log.error("cannot remove cgroup %s: %s", directory, exc)
                        break
                    time.sleep(0.01)


def _settings(limits: SandboxLimits) -> dict[str, str]:
    """Control file -> value, v1 and v2 names alike: each directory has only the files of its controller
    and version. In order: v1 wants the memory limit before memory+swap."""
    out: dict[str, str] = {}
    if limits.pids is not None:
        out["pids.max"] = str(limits.pids)
    if limits.memory_mb is not None:
        size = str(limits.memory_mb * 1024 * 1024)
        out.update({"memory.limit_in_bytes": size, "memory.memsw.limit_in_bytes": size})
        out.update({"memory.max": size, "memory.swap.max": "0"})
    if limits.cpus is not None:
        out.update(cpu_quota(limits.cpus))
    return out


def cpu_quota(cpus: float) -> dict[str, str]:
    """The cpu controller's files for a quota of `cpus` cores per CPU_PERIOD_US (v1 and v2 names alike)."""
    quota = str(max(MIN_CPU_QUOTA_US, int(cpus * CPU_PERIOD_US)))
    return {"cpu.cfs_period_us": str(CPU_PERIOD_US), "cpu.cfs_quota_us": quota, "cpu.max": f"{quota} {CPU_PERIOD_US}"}


def create(hierarchies: list[Hierarchy], owner: str, sandbox_id: str) -> SandboxCgroup:
    """Make the sandbox's (still unlimited) cgroups; a hierarchy that refuses is logged and skipped."""
    made: list[Path] = []
    for hierarchy in hierarchies:
        owner_dir = hierarchy.base / owner
        try:
            owner_dir.mkdir(exist_ok=True)
            if hierarchy.version == 2:
                _enable(owner_dir, hierarchy.controllers)
            else:
                _inherit_cpuset(owner_dir)
            directory = owner_dir / sandbox_id
            directory.mkdir()
        except OSError as exc:
            log.warning("cannot create cgroup under %s: %s", owner_dir, exc)
            continue
        try:
            if hierarchy.version == 1:
                _inherit_cpuset(directory)
        except OSError as exc:  # nothing could join it
            log.warning("cannot set up cgroup %s: %s", directory, exc)
            directory.rmdir()
            continue
        made.append(directory)
    return SandboxCgroup(made)


def owner_directories(hierarchies: list[Hierarchy]) -> dict[str, list[Path]]:
    """Owner id -> its cgroup directories, for the reaper."""
    out: dict[str, list[Path]] = {}
    for hierarchy in hierarchies:
        with contextlib.suppress(OSError):
            for child in hierarchy.base.iterdir():
                if child.is_dir():
                    out.setdefault(child.name, []).append(child)
    return out


def adopt(cgroup: SandboxCgroup, pid: int, timeout_s: float = 5.0) -> list[Path]:
    """Move every member of `pid`'s cgroups into `cgroup`, in each hierarchy `cgroup` has a directory in
    (members forked meanwhile too, until none is left or `timeout_s`); returns the emptied cgroups.

    For a runtime whose processes start in cgroups of their own (podman's): afterwards the sandbox's limits,
    CPU grants and kill reach them as they reach the processes of the other runtimes. OSError if one cannot
    be moved (or `pid` is gone)."""
    with open(f"/proc/{pid}/cgroup") as f:
        paths = [line.rstrip("\n").split(":", 2) for line in f]
    mounts = _mounts()
    emptied = []
    for directory in cgroup.directories:
        source = None
        for root, point, options in mounts:
            if directory.is_relative_to(point):
                fstype, opts = options.split(" ", 1)
                names = {""} if fstype == "cgroup2" else set(opts.split(","))
                for _, controllers, path in paths:
                    if set(controllers.split(",") if controllers else [""]) & names:
                        source = _inside(root, point, path)
                break
        if source is None or source == directory:
            continue
        deadline = time.monotonic() + timeout_s
        while members := [p for p in (source / "cgroup.procs").read_text().split() if p]:
            for member in members:
                with contextlib.suppress(ProcessLookupError):
                    (directory / "cgroup.procs").write_text(member)
            if time.monotonic() > deadline:
                raise OSError(f"processes {members} keep appearing in cgroup {source}")
        emptied.append(source)
    return emptied

"""The bubblewrap runtime: rootless sandboxes in new user, pid, ipc, uts (and by default net) namespaces.

The root of a sandbox is an empty tmpfs, remounted read-only once built, holding read-only binds of either
the host's system directories (`image=None`: /usr, /etc, /opt and the /bin, /lib... links, plus the
directories of the Python that runs the execution server) or every top-level directory of a root
filesystem directory (`image=<dir>`, e.g. an unpacked container image, whose `python3` then runs the
execution server from a bind of the prorl_server package). On top: a new /proc and /dev, size-limited
tmpfs mounts at the working directory, /tmp and /dev/shm, the spec's binds, and the socket directory at
/run/prorl. Host home directories, /root, /tmp, /run and /var are not there (but for the Python's
directories). See docs/sandboxes.md.

Start latency: `prewarm` bwrap processes per runtime wait, already inside fresh cgroups, for their
arguments on a pipe (`bwrap --args FD`): joining a cgroup v1 costs an RCU grace period (about 12 ms here),
which a start then does not wait for. Idle ones exit by themselves when the server dies (end of file).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import signal
import stat
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from prorl_server.sandbox.base import SandboxError
from prorl_server.sandbox.limits import BOOT_CODE, ENV_BOOT, MB, boot_settings, join_cgroups_argv, rlimits
from prorl_server.sandbox.loopback import ENV_ADDRESS
from prorl_server.sandbox.process import sandbox_env, signal_group
from prorl_server.sandbox.process_sandbox import (
    TOOL_PACKAGES,
    ProcessRuntime,
    Slot,
    host_python_path,
    package_dir,
    spawn,
)
from prorl_server.sandbox.spec import SandboxSpec
from prorl_server.tools.protocol import ENV_OWNER, ENV_SANDBOX_ID, SOCKET_NAME

log = logging.getLogger(__name__)

SOCKET_DIR = "/run/prorl"  # where the private socket directory appears inside
LIB_DIR = "/.prorl"  # image mode: where the execution server's packages are bound inside
HOST_SYSTEM = ("usr", "etc", "opt", "bin", "sbin", "lib", "lib32", "lib64", "libx32")
NOT_FROM_IMAGE = ("proc", "dev", "sys", "tmp", "run")
IMAGE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
BASE_ARGS = (
    "--die-with-parent",
    "--unshare-user",
    "--unshare-pid",
    "--unshare-ipc",
    "--unshare-uts",
    "--unshare-cgroup-try",
    "--disable-userns",
    "--hostname",
    "sandbox",
)


def _root_entries(root: Path, names: tuple[str, ...] | None, skip: tuple[str, ...]) -> list[str]:
    """bwrap arguments that rebuild `root`'s top level: read-only binds of directories, same symlinks."""
    args: list[str] = []
    for name in sorted(os.listdir(root)):
        path = root / name
        if (names is not None and name not in names) or name in skip:
            continue
        if path.is_symlink():
            args += ["--symlink", os.readlink(path), f"/{name}"]
        elif path.is_dir():
            args += ["--ro-bind", str(path), f"/{name}"]
    return args


def _host_masks() -> list[str]:
    """For a root server: hide what only root may read under /etc (shadow files, private keys)."""
    if os.geteuid() != 0:
        return []
    args: list[str] = []
    for top, dirs, files in os.walk("/etc"):
        for name in list(dirs):
            mode = os.lstat(os.path.join(top, name)).st_mode
            if stat.S_ISDIR(mode) and not mode & stat.S_IROTH:
                args += ["--tmpfs", os.path.join(top, name)]
                dirs.remove(name)
        for name in files:
            mode = os.lstat(os.path.join(top, name)).st_mode
            if stat.S_ISREG(mode) and not mode & stat.S_IROTH:
                args += ["--ro-bind", "/dev/null", os.path.join(top, name)]
    return args


def _python_dirs() -> list[str]:
    """Directories the host's Python and the tool packages live in, outside the host system directories."""
    candidates = [Path(sys.base_prefix), Path(sys.prefix), *(package_dir(p).parent for p in TOOL_PACKAGES)]
    kept: list[Path] = [Path("/", name) for name in HOST_SYSTEM]
    for path in sorted({c.resolve() for c in candidates}, key=lambda p: len(p.parts)):
        if not any(path == k or k in path.parents for k in kept):
            kept.append(path)
    return [str(p) for p in kept[len(HOST_SYSTEM) :]]


@dataclass
class _Launcher:
    """A bwrap already in its sandbox's cgroups, waiting for its arguments on a pipe."""

    slot: Slot
    popen: subprocess.Popen[bytes]
    args_fd: int

    def discard(self) -> None:
        """End of file on the pipe makes bwrap exit; kill it anyway, then remove the slot."""
        with contextlib.suppress(OSError):
            os.close(self.args_fd)
        signal_group(self.popen.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.popen.wait(timeout=5)
        self.slot.discard()


class BwrapRuntime(ProcessRuntime):
    """Starts bubblewrap sandboxes for one server instance (`owner`).

    Options as ProcessRuntime, plus `prewarm`: launchers kept waiting (0 = none; refilled after each
    start on the starting thread; see the module docstring).
    """

    name = "bwrap"
    monitor = True

    def __init__(self, owner: str, *, prewarm: int = 2, **options) -> None:
        super().__init__(owner, **options)
        self.prewarm = prewarm
        self._bwrap = shutil.which("bwrap") or "bwrap"
        self._host_root = [*_root_entries(Path("/"), HOST_SYSTEM, ()), *_host_masks()]
        # bound after the private /tmp and workdir mounts, which would hide a Python living under them
        self._python_binds = [arg for d in _python_dirs() for arg in ("--ro-bind", d, d)]
        # RLIMIT_NPROC counts per user namespace for a non-root user; a pids cgroup is better when there is one
        self._nproc = os.geteuid() != 0 and not any("pids" in h.controllers for h in self.cgroups)
        self._pool: dict[str, list[_Launcher]] = {}  # interpreter -> waiting launchers

    @classmethod
    def available(cls) -> str | None:
        """None if bwrap exists and can make the namespaces this runtime uses, else why not."""
        binary = shutil.which("bwrap")
        if binary is None:
            return "bubblewrap is not installed (Debian/Ubuntu: apt-get install bubblewrap)"
        probe = [binary, *BASE_ARGS, "--unshare-net", "--cap-drop", "ALL", *_root_entries(Path("/"), HOST_SYSTEM, ())]
        probe += ["--size", "1048576", "--tmpfs", "/tmp", "--remount-ro", "/", "true"]
        try:
            done = subprocess.run(probe, capture_output=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired) as exc:
            return f"bubblewrap cannot run: {exc}"
        if done.returncode != 0:
            return (
                f"bubblewrap cannot create its namespaces here: {done.stderr.decode(errors='replace').strip()} "
                "(bubblewrap >= 0.8 and unprivileged user namespaces are needed)"
            )
        return None

    def bwrap_args(self, spec: SandboxSpec, socket_dir: Path) -> list[str]:
        """bubblewrap's options for a spec (no program name, no command)."""
        args = [*BASE_ARGS]
        if spec.network == "none":
            args.append("--unshare-net")
        # uid 0 inside keeps every capability of the new user namespace unless dropped
        args += ["--uid", "0", "--gid", "0"] if spec.fakeroot else ["--cap-drop", "ALL"]
        if spec.image is None:
            args += self._host_root
        else:
            root = Path(spec.image)
            if not root.is_dir():
                raise SandboxError(f"bubblewrap needs a root directory as image, got {spec.image!r} (unpack it first)")
            args += _root_entries(root, None, NOT_FROM_IMAGE)
            args += [a for p in TOOL_PACKAGES for a in ("--ro-bind", str(package_dir(p)), f"{LIB_DIR}/{p}")]
        args += ["--dev", "/dev", "--proc", "/proc"]
        writable = ["/tmp", "/dev/shm", spec.workdir]
        if spec.image is not None and os.path.isdir(os.path.join(spec.image, "var", "tmp")):
            writable.append("/var/tmp")
        else:
            args += ["--symlink", "../tmp", "/var/tmp"]
        size = [] if spec.limits.disk_mb is None else ["--size", str(spec.limits.disk_mb * MB)]
        targets = {b.target for b in spec.binds}
        for path in writable:
            if path not in targets:
                args += [*size, "--tmpfs", path]
        if spec.image is None:
            args += self._python_binds
        for bind in spec.binds:
            if not os.path.exists(bind.source):
                raise SandboxError(f"bind source {bind.source} does not exist on the host")
            args += ["--ro-bind" if bind.read_only else "--bind", bind.source, bind.target]
        args += ["--bind", str(socket_dir), SOCKET_DIR, "--remount-ro", "/dev", "--remount-ro", "/"]
        return [*args, "--chdir", spec.workdir]

    def command(
        self, spec: SandboxSpec, sandbox_id: str, directory: Path, address: str | None
    ) -> tuple[list[str], dict[str, str], Path | None]:
        """The whole command without a launcher: bwrap, its options, the bootstrap."""
        python = sys.executable if spec.image is None else "python3"
        options = self.options(spec, address, directory / "sock")
        argv = [self._bwrap, *options, "--", python, "-I", "-S", "-c", BOOT_CODE]
        return argv, sandbox_env(self.owner, sandbox_id, {}), None

    def options(self, spec: SandboxSpec, address: str | None, socket_dir: Path) -> list[str]:
        """bwrap's options, then the sandbox's variables, the bootstrap's settings among them."""
        extra = {"HOME": spec.workdir, "TMPDIR": "/tmp", "PATH": IMAGE_PATH}
        if spec.image is None:
            extra["PATH"] = f"{Path(sys.executable).parent}:{os.environ.get('PATH', IMAGE_PATH)}"
        if address is not None:
            extra[ENV_ADDRESS] = address
        extra.update({k: v for k, v in spec.env.items() if k not in (ENV_OWNER, ENV_SANDBOX_ID)})
        server = ["--socket", f"{SOCKET_DIR}/{SOCKET_NAME}", "--workdir", spec.workdir] if spec.tools else None
        sys_path = host_python_path() if spec.image is None else [LIB_DIR]
        extra[ENV_BOOT] = boot_settings(rlimits(spec.limits, nproc=self._nproc), sys_path, server)
        setenv = [a for k, v in extra.items() for a in ("--setenv", k, v)]
        return [*self.bwrap_args(spec, socket_dir), *setenv]

    def _prepare(self, python: str) -> _Launcher:
        """A new launcher: `bwrap --args FD -- python -I -S -c BOOT` behind the cgroup-joining wrapper."""
        slot = self.new_slot()
        read, write = os.pipe()
        try:
            argv = [self._bwrap, "--args", str(read), "--", python, "-I", "-S", "-c", BOOT_CODE]
            env = sandbox_env(self.owner, slot.sandbox_id, {})
            popen = spawn(join_cgroups_argv(slot.cgroup.procs_files, argv), env, slot.directory, pass_fds=(read,))
        except BaseException:
            os.close(write)
            slot.discard()
            raise
        finally:
            os.close(read)
        return _Launcher(slot, popen, write)

    def _take(self, python: str) -> _Launcher:
        """A waiting launcher for this interpreter if there is a live one, else a new one."""
        while True:
            with self._lock:
                waiting = self._pool.get(python)
                launcher = waiting.pop(0) if waiting else None
            if launcher is None:
                return self._prepare(python)
            if launcher.popen.poll() is None:
                return launcher
            launcher.discard()

    def _refill(self, python: str) -> None:
        """Top the pool of this interpreter up to `prewarm` launchers."""
        with self._lock:
            missing = self.prewarm - len(self._pool.get(python, []))
        for _ in range(missing):
            try:
                launcher = self._prepare(python)
            except (OSError, SandboxError) as exc:
                log.warning("cannot prewarm a bubblewrap launcher: %s", exc)
                return
            with self._lock:
                waiting = self._pool.setdefault(python, [])
                keep = len(waiting) < self.prewarm
                if keep:
                    waiting.append(launcher)
            if not keep:
                launcher.discard()

    def launch(self, spec: SandboxSpec, address: str | None) -> tuple[Slot, subprocess.Popen[bytes]]:
        """Hand a launcher its options (after writing the spec's cgroup limits), then refill the pool soon."""
        if not self.prewarm:
            return super().launch(spec, address)
        python = sys.executable if spec.image is None else "python3"
        launcher = self._take(python)
        try:
            launcher.slot.cgroup.apply(spec.limits)
            options = self.options(spec, address, launcher.slot.directory / "sock")
            data = memoryview(b"".join(a.encode() + b"\0" for a in options))
            while data:
                data = data[os.write(launcher.args_fd, data) :]
            os.close(launcher.args_fd)
        except BaseException:
            launcher.discard()
            raise
        asyncio.get_running_loop().call_soon(self._refill, python)
        return launcher.slot, launcher.popen

    def close(self) -> None:
        """Discard the waiting launchers (the next start prewarms again), then as ProcessRuntime.close."""
        with self._lock:
            pool, self._pool = self._pool, {}
        for launcher in (launcher for waiting in pool.values() for launcher in waiting):
            launcher.discard()
        super().close()

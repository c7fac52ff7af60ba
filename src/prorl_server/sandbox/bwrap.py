"""The bubblewrap runtime: sandboxes in new pid, ipc, uts, mount (and by default net) namespaces.

The root of a sandbox is an empty tmpfs, remounted read-only once built, holding read-only binds of either
the host's system directories (`image=None`: /usr, /etc, /opt and the /bin, /lib... links, plus the
directories of the Python that runs the execution server) or every top-level directory of a root
filesystem directory (`image=<dir>`, e.g. an unpacked container image, whose `python3` then runs the
execution server from a bind of the prorl_server package). On top: a new /proc and /dev, size-limited
tmpfs mounts at the working directory, /tmp and /dev/shm, and the spec's binds (the execution server's
listening socket comes in as a descriptor, see process_sandbox.py). Host home directories, /root, /tmp, /run and /var are not there (but for the Python's
directories). See docs/sandboxes.md.

The sandbox never runs as host root. A server running as a normal user runs bwrap unprivileged: new user
namespace, the sandbox's users map to the server's user. A server running as root runs bwrap privileged,
without a user namespace (whose uid 0 would be host root), and the sandbox's first process, before any task
code, gives its writable mounts to `process.SANDBOX_UID` and becomes that uid for good: the sandbox then holds
no capability and no root identity, and cannot write the host's /proc/sys (bound read-only anyway). A root
server refuses `fakeroot`, as the Apptainer runtime does.

Start latency: `prewarm` bwrap processes per runtime wait, already inside fresh cgroups, for their
arguments on a pipe (`bwrap --args FD`): joining a cgroup v1 costs an RCU grace period (about 12 ms here),
which a start then does not wait for. Idle ones exit by themselves when the server dies (end of file).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shlex
import shutil
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from prorl_server.sandbox import seccomp
from prorl_server.sandbox.confinement import boot_source, seccomp_program
from prorl_server.sandbox.errors import SandboxError
from prorl_server.sandbox.limits import BOOT_CODE, ENV_BOOT, MB, boot_settings, join_cgroups_argv, rlimits
from prorl_server.sandbox.loopback import ENV_ADDRESS
from prorl_server.sandbox.process import sandbox_env, sandbox_user, signal_group
from prorl_server.sandbox.process_sandbox import ProcessRuntime, ProcessSandbox
from prorl_server.sandbox.slot import TOOL_PACKAGES, Command, Slot, host_python_path, package_dir, server_args, spawn
from prorl_server.sandbox.snapshot import Snapshot
from prorl_server.sandbox.spec import SandboxSpec
from prorl_server.tool_server.protocol import ENV_OWNER, ENV_SANDBOX_ID

log = logging.getLogger(__name__)

LIB_DIR = "/.prorl"  # image mode: where the execution server's packages are bound inside
HOST_SYSTEM = ("usr", "etc", "opt", "bin", "sbin", "lib", "lib32", "lib64", "libx32")
NOT_FROM_IMAGE = ("proc", "dev", "sys", "tmp", "run")
IMAGE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
BASE_ARGS = ("--die-with-parent", "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try")
BASE_ARGS += ("--hostname", "sandbox")
USERNS_ARGS = ("--unshare-user", "--disable-userns")  # run unprivileged: its own user namespace, no nested ones
# Run privileged (by root): what the first process needs to hand the sandbox to SANDBOX_UID; gone after that
SWITCH_CAPS = ("--cap-drop", "ALL", "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID", "--cap-add", "CAP_CHOWN")
# bwrap covers /proc/sys read-only only where it finds the directory writable; its files may be anyway
PROC_ARGS = ("--dev", "/dev", "--proc", "/proc", "--ro-bind", "/proc/sys", "/proc/sys")


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


def _python_dirs() -> list[str]:
    """Directories the host's Python and the tool packages live in, outside the host system directories."""
    candidates = [Path(sys.base_prefix), Path(sys.prefix), *(package_dir(p).parent for p in TOOL_PACKAGES)]
    kept: list[Path] = [Path("/", name) for name in HOST_SYSTEM]
    for path in sorted({c.resolve() for c in candidates}, key=lambda p: len(p.parts)):
        if not any(path == k or k in path.parents for k in kept):
            kept.append(path)
    return [str(p) for p in kept[len(HOST_SYSTEM) :]]


class _MountPoints:
    """Mount points of one sandbox, and the directories leading to them.

    A privileged (root) bwrap makes missing directories on the way to a mount point with mode 0700, which the
    sandbox's unprivileged user could not pass: with `enabled`, those are made first with mode 0755. Inside
    a bind of the host or the image nothing is made (it is there already, or not ours to make); inside the
    sandbox's own tmpfs mounts (a Python under /tmp, say) the missing directories are made as anywhere else.
    """

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self._bound: set[str] = set()
        self._made: set[str] = {"/"}

    def mount(self, option: str, *operands: str) -> list[str]:
        """`option` with its operands, the last being the mount point, preceded by its missing parents."""
        target = operands[-1]
        args: list[str] = []
        if self.enabled:
            for parent in reversed(PurePosixPath(target).parents):
                name = str(parent)
                if name in self._bound:
                    break
                if name not in self._made:
                    args += ["--perms", "0755", "--dir", name]
                    self._made.add(name)
        (self._made if option == "--tmpfs" else self._bound).add(target)
        return [*args, option, *operands]

    def mark(self, *targets: str) -> None:
        """Record binds made by options that did not go through `mount`."""
        self._bound.update(targets)


def _seccomp_fd() -> int | None:
    """A memfd with the seccomp program for one bwrap (`--seccomp` reads it to the end), None without one."""
    program = seccomp_program()
    return None if program is None else seccomp.program_fd(program)


def _merged(slot: Slot, index: int) -> Path:
    """Where a fork's overlay of snapshot layer `index` is mounted (in the fork's own mount namespace)."""
    return slot.directory / "fork" / f"m{index}"


def _overlay_argv(snapshot: Snapshot, slot: Slot, disk_mb: int | None) -> list[str]:
    """The command before bwrap that gives a fork its writable mounts: in a new mount namespace (private, so
    nothing reaches the host's and everything goes when the sandbox's last process does), per snapshot layer
    a tmpfs of `disk_mb` holding the upper layer, and an overlay of it over the snapshot's copy. The merged
    root's owner and mode are a fresh tmpfs mount's, as the snapshotted sandbox's were (a root server's
    bootstrap then gives it to the sandbox's user)."""
    script = ["set -e"]
    size = "" if disk_mb is None else f"size={disk_mb * MB},"
    for index in range(len(snapshot.layers)):
        lower, own, merged = snapshot.layer(index), slot.directory / "fork" / f"t{index}", _merged(slot, index)
        if any(c in str(p) for p in (lower, own) for c in ",:"):
            raise SandboxError(f"overlay paths cannot hold ',' or ':': {lower}, {own}")
        own.mkdir(parents=True)
        merged.mkdir()
        upper, work = shlex.quote(str(own / "u")), shlex.quote(str(own / "w"))
        options = f"lowerdir={lower},upperdir={own}/u,workdir={own}/w"
        script += [
            f"mount -t tmpfs -o {size}mode=0700 prorl-fork {shlex.quote(str(own))}",
            f"mkdir -m 0755 {upper} {work}",
            f"mount -t overlay -o {shlex.quote(options)} prorl-fork {shlex.quote(str(merged))}",
        ]
    script.append('exec "$@"')
    return ["unshare", "--mount", "--propagation", "private", "/bin/sh", "-c", "\n".join(script), "sh"]


@dataclass
class _Launcher:
    """A bwrap already in its sandbox's cgroups, waiting for its arguments on a pipe."""

    slot: Slot
    popen: subprocess.Popen[bytes]
    args_fd: int
    seccomp_fd: int | None  # its number in the launcher, which holds the program (the host closed its copy)

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
    snapshots_in_memory = True  # copies of its tmpfs mounts: memory as they were, and ten times faster to make

    def __init__(self, owner: str, *, prewarm: int = 2, **options) -> None:
        super().__init__(owner, **options)
        self.prewarm = prewarm
        self.user = sandbox_user()  # None: bwrap runs unprivileged, as this server's user
        self._bwrap = shutil.which("bwrap") or "bwrap"
        self._host_root = _root_entries(Path("/"), HOST_SYSTEM, ())
        # bound after the private /tmp and workdir mounts, which would hide a Python living under them
        self._python_dirs = _python_dirs()
        # RLIMIT_NPROC counts per user namespace (per uid without one); a pids cgroup is better when there is one
        self._nproc = self.user is None and not any("pids" in h.controllers for h in self.cgroups)
        self._pool: dict[str, list[_Launcher]] = {}  # interpreter -> waiting launchers

    @classmethod
    def available(cls) -> str | None:
        """None if bwrap exists and can make the namespaces this runtime uses, else why not."""
        binary = shutil.which("bwrap")
        if binary is None:
            return "bubblewrap is not installed (Debian/Ubuntu: apt-get install bubblewrap)"
        mode = USERNS_ARGS if sandbox_user() is None else ()
        probe = [binary, *BASE_ARGS, *mode, "--unshare-net", "--cap-drop", "ALL", *PROC_ARGS]
        probe += [*_root_entries(Path("/"), HOST_SYSTEM, ()), "--size", "1048576", "--tmpfs", "/tmp"]
        probe += ["--remount-ro", "/", "true"]
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

    def fork_unavailable(self) -> str | None:
        """None for a server running as root (the overlays of forks are mounted in a mount namespace of their
        own, which bubblewrap 0.8 cannot make unprivileged), else why not."""
        if self.user is None:
            return (
                "bubblewrap forks sandboxes only for a server running as root (their overlays are mounted before "
                "bwrap starts); as a normal user the apptainer runtime forks"
            )
        if shutil.which("unshare") is None:
            return "forking bubblewrap sandboxes needs unshare(1) from util-linux on the host"
        return None

    async def capture(self, sandbox: ProcessSandbox, directory: Path) -> tuple[str, ...]:
        """Copy each of the sandbox's own writable mounts that is not empty into `<directory>/<n>/` while its
        processes are stopped (SIGSTOP), then kill them; the copy is read through /proc/<pid>/root of a
        process inside, without following links or crossing into other mounts. A fork gets a fresh tmpfs
        for an empty one, as the sandbox had."""
        targets = {b.target for b in sandbox.spec.binds}
        paths = tuple(p for p in self.writable(sandbox.spec) if p not in targets)
        return await asyncio.to_thread(self._copy_out, sandbox, paths, directory)

    @staticmethod
    def _copy_out(sandbox: ProcessSandbox, paths: tuple[str, ...], directory: Path) -> tuple[str, ...]:
        own = os.stat("/proc/self/ns/mnt").st_ino
        inside = None
        for _ in range(2):  # a process forked while the first pass stopped the others is stopped by the second
            for pid in sorted(sandbox.processes() - {sandbox.pid}):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGSTOP)
                with contextlib.suppress(OSError):
                    if inside is None and os.stat(f"/proc/{pid}/ns/mnt").st_ino != own:
                        inside = pid
        if inside is None:
            raise SandboxError(f"sandbox {sandbox.id} has no process left to snapshot it through")
        try:
            layers = tuple(p for p in paths if os.listdir(f"/proc/{inside}/root{p}"))
        except OSError as exc:
            raise SandboxError(f"cannot read sandbox {sandbox.id}'s writable mounts: {exc}") from exc
        for index, path in enumerate(layers):
            target = directory / str(index)
            target.mkdir()
            done = subprocess.run(
                ["cp", "-a", "--one-file-system", "--", f"/proc/{inside}/root{path}/.", str(target)],
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
            )
            if done.returncode != 0:
                raise SandboxError(f"cannot snapshot the sandbox's {path}: {done.stderr.strip()[-2000:]}")
        sandbox.kill()  # stopped processes would sit out close()'s SIGTERM grace period
        return layers

    def bwrap_args(self, spec: SandboxSpec, seccomp_fd: int | None = None, slot: Slot | None = None) -> list[str]:
        """bubblewrap's options for a spec (no program name, no command); the seccomp program is read from
        `seccomp_fd` (in bwrap's process). For a fork (`slot.fork`), the writable mounts the snapshot holds are
        binds of the overlays `_overlay_argv` mounts."""
        layers = () if slot is None or slot.fork is None else slot.fork.layers
        args = [*BASE_ARGS]
        if spec.network == "none":
            args.append("--unshare-net")
        if self.user is not None:
            if spec.fakeroot:
                raise SandboxError(
                    "bubblewrap cannot give a server running as root a safe fakeroot sandbox (its root would be "
                    "the host's root); run the server as a normal user for fakeroot"
                )
            args += SWITCH_CAPS
        else:  # uid 0 inside keeps every capability of the new user namespace unless dropped
            args += [*USERNS_ARGS, *(("--uid", "0", "--gid", "0") if spec.fakeroot else ("--cap-drop", "ALL"))]
        points = _MountPoints(enabled=self.user is not None)
        if spec.image is None:
            args += self._host_root
            points.mark(*(f"/{name}" for name in HOST_SYSTEM))
        else:
            root = Path(spec.image)
            if not root.is_dir():
                raise SandboxError(f"bubblewrap needs a root directory as image, got {spec.image!r} (unpack it first)")
            args += _root_entries(root, None, NOT_FROM_IMAGE)
            points.mark(*(f"/{name}" for name in os.listdir(root) if name not in NOT_FROM_IMAGE))  # those: ours
            for package in TOOL_PACKAGES:
                args += points.mount("--ro-bind", str(package_dir(package)), f"{LIB_DIR}/{package}")
        args += PROC_ARGS
        points.mark("/dev", "/proc")
        writable = self.writable(spec)
        if "/var/tmp" not in writable:
            args += ["--symlink", "../tmp", "/var/tmp"]
        size = [] if spec.limits.disk_mb is None else ["--size", str(spec.limits.disk_mb * MB)]
        targets = {b.target for b in spec.binds}
        for path in writable:
            if path in targets:
                continue
            if path in layers:
                assert slot is not None
                args += points.mount("--bind", str(_merged(slot, layers.index(path))), path)
            else:
                args += [*size, *points.mount("--tmpfs", path)]
        if spec.image is None:
            for directory in self._python_dirs:
                args += points.mount("--ro-bind", directory, directory)
        for bind in spec.binds:
            if not os.path.exists(bind.source):
                raise SandboxError(f"bind source {bind.source} does not exist on the host")
            args += points.mount("--ro-bind" if bind.read_only else "--bind", bind.source, bind.target)
        args += ["--remount-ro", "/dev", "--remount-ro", "/"]
        if seccomp_fd is not None:
            args += ["--seccomp", str(seccomp_fd)]
        return [*args, "--chdir", spec.workdir]

    @staticmethod
    def writable(spec: SandboxSpec) -> list[str]:
        """The sandbox's own size-limited tmpfs mounts (an image's /var/tmp among them if it has one)."""
        paths = ["/tmp", "/dev/shm", spec.workdir]
        if spec.image is not None and os.path.isdir(os.path.join(spec.image, "var", "tmp")):
            paths.append("/var/tmp")
        return paths

    def command(self, spec: SandboxSpec, slot: Slot, address: str | None, landlock_fd: int | None) -> Command:
        """The whole command without a launcher: bwrap, its options, the bootstrap."""
        python = sys.executable if spec.image is None else "python3"
        command = Command([], sandbox_env(self.owner, slot.sandbox_id, {}))
        seccomp_fd = _seccomp_fd()
        if seccomp_fd is not None:
            command.owned_fds.append(seccomp_fd)
        command.pass_fds = tuple(fd for fd in (seccomp_fd, landlock_fd) if fd is not None)
        try:
            options = self.options(spec, address, slot, seccomp_fd, landlock_fd)
        except BaseException:
            command.close()
            raise
        command.argv = [self._bwrap, *options, "--", python, "-I", "-S", "-c", BOOT_CODE]
        if slot.fork is not None:
            command.argv = [*_overlay_argv(slot.fork, slot, spec.limits.disk_mb), *command.argv]
        return command

    def options(
        self, spec: SandboxSpec, address: str | None, slot: Slot, seccomp_fd: int | None, landlock_fd: int | None
    ) -> list[str]:
        """bwrap's options, then the sandbox's variables, the bootstrap's settings among them (with the
        Landlock ruleset `landlock_fd` to restrict itself to, if any)."""
        extra = {"HOME": spec.workdir, "TMPDIR": "/tmp", "PATH": IMAGE_PATH}
        if spec.image is None:
            extra["PATH"] = f"{Path(sys.executable).parent}:{os.environ.get('PATH', IMAGE_PATH)}"
        if address is not None:
            extra[ENV_ADDRESS] = address
        extra.update({k: v for k, v in spec.env.items() if k not in (ENV_OWNER, ENV_SANDBOX_ID)})
        sys_path = host_python_path() if spec.image is None else [LIB_DIR]
        server = server_args(spec, slot, spec.workdir)
        user = None if self.user is None else (self.user, self.writable(spec))
        limits, pre = rlimits(spec.limits, nproc=self._nproc), boot_source(landlock_fd, None)
        extra[ENV_BOOT] = boot_settings(limits, sys_path, server, user, pre)
        setenv = [a for k, v in extra.items() for a in ("--setenv", k, v)]
        return [*self.bwrap_args(spec, seccomp_fd, slot), *setenv]

    def _prepare(self, python: str) -> _Launcher:
        """A new launcher: `bwrap --args FD -- python -I -S -c BOOT` behind the cgroup-joining wrapper."""
        slot = self.new_slot()
        read, write = os.pipe()
        seccomp_fd = None
        try:
            seccomp_fd = _seccomp_fd()
            argv = [self._bwrap, "--args", str(read), "--", python, "-I", "-S", "-c", BOOT_CODE]
            env = sandbox_env(self.owner, slot.sandbox_id, {})
            fds = (read,) if seccomp_fd is None else (read, seccomp_fd)
            popen = spawn(join_cgroups_argv(slot.cgroup.procs_files, argv), env, slot, pass_fds=fds)
        except BaseException:
            os.close(write)
            slot.discard()
            raise
        finally:
            os.close(read)
            if seccomp_fd is not None:
                os.close(seccomp_fd)
        slot.spawned()
        return _Launcher(slot, popen, write, seccomp_fd)

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

    def launch(
        self, spec: SandboxSpec, address: str | None, landlock_fd: int | None, fork: Snapshot | None = None
    ) -> tuple[Slot, subprocess.Popen[bytes]]:
        """Hand a launcher its options (after writing the spec's cgroup limits), then refill the pool soon."""
        if not self.prewarm or landlock_fd is not None or fork is not None:  # no ruleset descriptor, no overlays
            return super().launch(spec, address, landlock_fd, fork)
        python = sys.executable if spec.image is None else "python3"
        launcher = self._take(python)
        try:
            launcher.slot.cgroup.apply(spec.limits)
            options = self.options(spec, address, launcher.slot, launcher.seccomp_fd, None)
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

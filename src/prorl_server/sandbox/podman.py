"""The Podman runtime: each sandbox is one `podman run` of a local image or a root directory.

The image is a reference in podman's local storage (`localhost/NAME:TAG`, made by `prorl-server build-image
--runtime podman` or imported with `podman import`; never pulled: `--pull never`) or a root directory, run
with `--rootfs DIR:O` (an overlay on top: the directory is never written). The container has its own pid,
ipc, uts and mount namespaces, `--network none` unless the spec asks for the host network (`host`, and
`loopback`, whose 127.x address it is given as for the other runtimes), no capabilities
(`--cap-drop all`), `no-new-privileges`, podman's default seccomp profile and, from the bootstrap, ours.

Never host root: a server running as root runs its containers as `--user 65534:65534` (nobody) and refuses
`fakeroot`; a normal user's podman is rootless (the container's root is that user). The root filesystem is
read-only; the working directory (also $HOME), /tmp and /var/tmp are tmpfs mounts of `limits.disk_mb` each
(with `disk_mb=None`: unsized, and the root is the container's writable layer instead).

The execution server's listening socket is passed in as descriptor 3 (`--preserve-fds`; a Landlock ruleset
as 4), so no host directory is bound for it; this host's tool packages are bound read-only at /.prorl, so an
image needs only python3. Limits: rlimits by the bootstrap (podman's own are this server's hard limits,
which a root container may not raise); memory, swap, cpus and pids by cgroups. The container starts in
podman's cgroups, limited by `--memory`, `--memory-swap`, `--cpus` and `--pids-limit`; once its execution
server answers (before the sandbox is handed out, so before any task code runs) its processes are moved
into the sandbox's own cgroups (`cgroups.adopt`), where the limits, the action scheduler's per-action CPU
grants (cpu_grants.py) and close's kill reach them as for the other runtimes. (podman's --cgroup-parent
cannot do this on cgroup v1, where the sandbox's cgroups may sit at different paths per controller, and
--cgroups=disabled needs crun.)

Every container is named `prorl-<sandbox id>` and labelled `prorl.owner=<owner id>`; every process in it
carries the owner tags. Closing a sandbox removes its container (`podman rm -f`); the reaper removes what
a crashed server left by label (`remove_containers`). Where crun cannot run (cgroup v1 hybrid hosts), runc
is used: `probe()` tries podman's default OCI runtime, then runc, once per process.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import resource
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from prorl_server.sandbox import cgroups
from prorl_server.sandbox.confinement import boot_source, seccomp_program
from prorl_server.sandbox.containers import ENV_BINARY, LABEL, REMOVE_TIMEOUT_S, find_podman, kill_monitors, mark
from prorl_server.sandbox.errors import SandboxError
from prorl_server.sandbox.limits import BOOT_CODE, ENV_BOOT, boot_settings, rlimits
from prorl_server.sandbox.loopback import ENV_ADDRESS
from prorl_server.sandbox.private_dir import ensure_private_dir
from prorl_server.sandbox.process import sandbox_env, sandbox_user
from prorl_server.sandbox.process_sandbox import ProcessRuntime, ProcessSandbox
from prorl_server.sandbox.reaper import kill_tagged
from prorl_server.sandbox.slot import TOOL_PACKAGES, Command, Slot, package_dir
from prorl_server.sandbox.spec import SandboxSpec
from prorl_server.tool_server.protocol import ENV_OWNER, ENV_SANDBOX_ID

if TYPE_CHECKING:
    from prorl_server.actions import Grant

log = logging.getLogger(__name__)

LIB_DIR = "/.prorl"
IMAGE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
NOT_FOUND = f"podman not found: install it (as root on Debian: `apt-get install podman runc`) or set {ENV_BINARY}"
REMOVE_ATTEMPTS = 3  # tries of `podman rm -f` for one container
REMOVE_RETRY_S = 0.5  # between them
PIDFILE = "container.pid"  # in the slot's private directory: the container's first process, on the host
PROBE_TIMEOUT_S = 60.0
CLIENT_EXIT_S = 10.0  # for a SIGKILLed podman client to end, before its container is removed
PODMAN_NPROC = 32768  # the RLIMIT_NPROC podman 4 gives itself as it starts (seen with 4.3.1 as root)
# Moves the descriptors named in argv[1] (comma-separated) to 3, 4, ... and execs the rest: podman passes
# descriptors 3..3+N-1 into the container (--preserve-fds N), and /bin/sh (dash) cannot name fds above 9.
FD_SHIM = (
    "import fcntl, os, sys\n"
    "fds = [int(f) for f in sys.argv[1].split(',')]\n"
    "moved = [fcntl.fcntl(f, fcntl.F_DUPFD_CLOEXEC, 3 + len(fds)) for f in fds]\n"
    "for f in fds: os.close(f)\n"
    "for i, f in enumerate(moved):\n"
    "    os.dup2(f, 3 + i); os.close(f)\n"
    "os.execvp(sys.argv[2], sys.argv[2:])\n"
)


def ulimit_args() -> list[str]:
    """`--ulimit` options no higher than the hard limits a container of root podman may not exceed: this
    process's, and for processes PODMAN_NPROC (podman sets its own hard limit to that as it starts)."""
    args = []
    for name, key, cap in (("nofile", resource.RLIMIT_NOFILE, None), ("nproc", resource.RLIMIT_NPROC, PODMAN_NPROC)):
        hard = resource.getrlimit(key)[1]
        values = [v for v in (None if hard == resource.RLIM_INFINITY else hard, cap) if v is not None]
        value = min(values) if values else -1
        args += ["--ulimit", f"{name}={value}:{value}"]
    return args


@functools.cache
def probe() -> tuple[tuple[str, ...], str | None]:
    """podman's global options that work here (`--runtime runc` where the default OCI runtime cannot run)
    and None, or () and why podman cannot work; run once per process (a container of the host root,
    under an overlay so nothing is written)."""
    binary = find_podman()
    if binary is None:
        return (), NOT_FOUND
    candidates: list[tuple[str, ...]] = [()]
    if shutil.which("runc"):
        candidates.append(("--runtime", "runc"))
    failures = []
    for options in candidates:
        name = f"prorl-probe-{os.getpid()}-{len(failures)}"
        argv = [binary, *options, "run", "--rm", "--name", name, "--pull", "never", "--network", "none"]
        argv += ["--cap-drop", "all", "--log-driver", "none"]
        argv += [*ulimit_args(), "--rootfs", "/:O", "true"]
        try:
            done = subprocess.run(
                argv, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=PROBE_TIMEOUT_S
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            failures.append(f"{' '.join(options) or 'default runtime'}: {exc}")
            if isinstance(exc, subprocess.TimeoutExpired):  # the killed client may have left its container
                with contextlib.suppress(OSError, subprocess.TimeoutExpired):
                    subprocess.run(
                        [binary, *options, "rm", "-f", "-t", "0", "--ignore", name],
                        stdin=subprocess.DEVNULL,
                        capture_output=True,
                        timeout=REMOVE_TIMEOUT_S,
                    )
            continue
        if done.returncode == 0:
            return options, None
        failures.append(f"{' '.join(options) or 'default runtime'}: {done.stderr.strip()[-500:]}")
    hint = "" if shutil.which("runc") else " (where crun fails, e.g. cgroup v1 hybrid hosts, install runc)"
    return (), f"podman cannot run a container here{hint}: {'; '.join(failures)}"


def podman_command() -> list[str]:
    """The podman binary with the global options `probe()` found (SandboxError if podman cannot work)."""
    options, reason = probe()
    if reason is not None:
        raise SandboxError(reason)
    return [find_podman() or "podman", *options]


def container_name(sandbox_id: str) -> str:
    """The name of a sandbox's container."""
    return f"prorl-{sandbox_id}"


class PodmanSandbox(ProcessSandbox):
    """A ProcessSandbox whose processes live in a podman container: stopping it removes the container
    (its processes are conmon's children, outside the podman client's process group)."""

    def __init__(self, *, remove: Callable[[str], None], **options) -> None:
        self._remove = remove
        self._removed = threading.Event()
        super().__init__(**options)

    def _remove_container(self) -> None:
        if not self._removed.is_set():
            self._removed.set()
            self._remove(container_name(self.id))

    def _kill_all(self) -> None:
        """SIGKILL the podman client (as ProcessSandbox), wait for it to end, then remove the container and
        kill what still carries this sandbox's id. In that order: a client stopped while it was still
        creating the container would create it after a removal that found nothing."""
        super()._kill_all()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._popen.wait(timeout=CLIENT_EXIT_S)
        self._remove_container()
        kill_tagged(ENV_SANDBOX_ID, self.id)  # where podman rm failed: the processes at least
        kill_monitors(self.slot.directory)  # a container podman lost while it was being created

    def adopt(self, timeout_s: float) -> None:
        """Move the container's processes into the sandbox's cgroups (blocking; SandboxError if it fails)."""
        pidfile = self.slot.directory / PIDFILE
        deadline = time.monotonic() + timeout_s
        while not (text := pidfile.read_text().strip() if pidfile.exists() else ""):
            if self._popen.poll() is not None or time.monotonic() > deadline:
                raise SandboxError(f"podman wrote no container pid; its output:\n{self.slot.log.text() or '(none)'}")
            time.sleep(0.005)
        try:
            cgroups.adopt(self.slot.cgroup, int(text))
        except (OSError, ValueError) as exc:
            raise SandboxError(f"cannot move the container's processes into the sandbox's cgroups: {exc}") from exc

    async def _terminate(self) -> None:
        """Kill the client and remove the container (`podman rm -t 0` gives no grace period anyway)."""
        await asyncio.to_thread(self._kill_all)


class PodmanRuntime(ProcessRuntime):
    """Starts Podman sandboxes for one server instance (`owner`); options as ProcessRuntime.

    `run_as`: the uid and gid containers run as when this process is root (default: `process.SANDBOX_UID`).
    """

    name = "podman"

    def __init__(self, owner: str, *, run_as: int | None = None, **options) -> None:
        super().__init__(owner, **options)
        self.podman = podman_command()
        ensure_private_dir(self.base_dir)
        mark(self.base_dir / owner)  # the reaper looks for this owner's containers (containers.py)
        self.run_as = (run_as or sandbox_user()) if os.geteuid() == 0 else None
        self._ulimits = ulimit_args()
        self._known_images: set[str] = set()

    @classmethod
    def available(cls) -> str | None:
        """None if podman can run a container here (probed once), else why not."""
        return probe()[1]

    async def _start(self, spec: SandboxSpec, grant: Grant | None) -> ProcessSandbox:
        """Start as every process runtime does, then move the container into the sandbox's cgroups."""
        sandbox = await super()._start(spec, grant)
        try:
            await asyncio.to_thread(sandbox.adopt, self.ready_timeout_s)
        except BaseException:
            await sandbox.close()
            raise
        return sandbox

    def sandbox(self, **options) -> PodmanSandbox:
        """A PodmanSandbox (see ProcessRuntime.sandbox)."""
        return PodmanSandbox(remove=self._remove, **options)

    def _remove(self, name: str) -> None:
        """`podman rm -f` one container, tried again where it fails (logged if the last try fails too): racing
        the cleanup conmon runs as the container exits, `podman rm` can fail with "container not running"."""
        for attempt in range(REMOVE_ATTEMPTS):
            try:
                done = subprocess.run(
                    [*self.podman, "rm", "-f", "-t", "0", "--ignore", name],
                    stdin=subprocess.DEVNULL,
                    capture_output=True,
                    text=True,
                    timeout=REMOVE_TIMEOUT_S,
                )
            except (OSError, subprocess.TimeoutExpired) as exc:
                problem = str(exc)
            else:
                if done.returncode == 0:
                    return
                problem = done.stderr.strip()
            if attempt + 1 < REMOVE_ATTEMPTS:
                time.sleep(REMOVE_RETRY_S)
        log.error("cannot remove podman container %s: %s", name, problem)

    def check_image(self, image: str) -> None:
        """SandboxError unless `image` is a root directory or in podman's local storage (looked up once)."""
        if os.path.isdir(image) or image in self._known_images:
            return
        done = subprocess.run([*self.podman, "image", "exists", image], stdin=subprocess.DEVNULL, capture_output=True)
        if done.returncode != 0:
            raise SandboxError(
                f"image {image!r} is neither a root directory nor in podman's local storage (build one with "
                "`prorl-server build-image --runtime podman`, or `podman import` a root filesystem)"
            )
        self._known_images.add(image)

    def podman_args(self, spec: SandboxSpec, slot: Slot, fds: int) -> list[str]:
        """The `podman run` command line up to (not including) the command run inside; `fds` descriptors
        are passed in from 3 on."""
        if spec.image is None:
            raise SandboxError("the podman runtime needs spec.image: a local podman image or a root directory")
        self.check_image(spec.image)
        args = [*self.podman, "run", "--rm", "--pull", "never", "--name", container_name(slot.sandbox_id)]
        args += ["--pidfile", str(slot.directory / PIDFILE)]
        args += ["--label", f"{LABEL}={self.owner}", "--log-driver", "none", "--sig-proxy=false"]
        args += ["--preserve-fds", str(fds), "--cap-drop", "all", "--security-opt", "no-new-privileges"]
        args += ["--network", "none" if spec.network == "none" else "host", *self._ulimits]
        if spec.network == "none":
            args += ["--hostname", "sandbox"]
        if self.run_as is not None:
            if spec.fakeroot:
                raise SandboxError(
                    "podman cannot give a server running as root a safe fakeroot sandbox (its root would be the "
                    "host's root); run the server as a normal user (rootless podman) for fakeroot"
                )
            args += ["--user", f"{self.run_as}:{self.run_as}"]
        limits = spec.limits
        if limits.memory_mb is not None:
            args += ["--memory", f"{limits.memory_mb}m", "--memory-swap", f"{limits.memory_mb}m"]
        if limits.cpus is not None:
            args += ["--cpus", str(limits.cpus)]
        if limits.pids is not None:
            args += ["--pids-limit", str(limits.pids)]
        size = "" if limits.disk_mb is None else f",size={limits.disk_mb}m"
        if limits.disk_mb is not None:
            args += ["--read-only", "--shm-size", f"{limits.disk_mb}m"]
        targets = {b.target for b in spec.binds}
        if spec.workdir not in targets:
            args += ["--tmpfs", f"{spec.workdir}:rw,mode=0700,U{size}"]
        for path in ("/tmp", "/var/tmp"):
            if path not in targets and path != spec.workdir:
                args += ["--tmpfs", f"{path}:rw,mode=1777{size}"]
        for bind in spec.binds:
            if ":" in bind.source + bind.target:
                raise SandboxError(f"podman cannot bind paths with ':': {bind.source} -> {bind.target}")
            if not os.path.exists(bind.source):
                raise SandboxError(f"bind source {bind.source} does not exist on the host")
            args += ["--volume", f"{bind.source}:{bind.target}:{'ro' if bind.read_only else 'rw'}"]
        for package in TOOL_PACKAGES:
            args += ["--volume", f"{package_dir(package)}:{LIB_DIR}/{package}:ro"]
        args += ["--workdir", spec.workdir]
        return args

    def environment(self, spec: SandboxSpec, slot: Slot, address: str | None, landlock: bool) -> dict[str, str]:
        """The container's variables: scrubbed and tagged, HOME the working directory, the bootstrap's
        settings (the listening socket at 3, a Landlock ruleset at 4 if `landlock`)."""
        server = ["--listen-fd", "3", "--workdir", spec.workdir] if spec.tools else None
        pre = boot_source(4 if landlock else None, seccomp_program())
        boot = boot_settings(rlimits(spec.limits, nproc=False), [LIB_DIR], server, pre=pre)
        extra = {"HOME": spec.workdir, "TMPDIR": "/tmp", "PATH": IMAGE_PATH}
        if address is not None:
            extra[ENV_ADDRESS] = address
        extra.update({k: v for k, v in spec.env.items() if k not in (ENV_OWNER, ENV_SANDBOX_ID)})
        extra[ENV_BOOT] = boot
        return sandbox_env(self.owner, slot.sandbox_id, extra)

    def command(self, spec: SandboxSpec, slot: Slot, address: str | None, landlock_fd: int | None) -> Command:
        """The descriptor shim, then `podman run` of the rlimit bootstrap that runs the execution server."""
        fds = (slot.listen_fd,) if landlock_fd is None else (slot.listen_fd, landlock_fd)
        args = self.podman_args(spec, slot, len(fds))
        inside = self.environment(spec, slot, address, landlock_fd is not None)
        env_args = [a for k, v in inside.items() for a in ("--env", f"{k}={v}")]
        image = ["--rootfs", f"{spec.image}:O"] if os.path.isdir(str(spec.image)) else [str(spec.image)]
        run = [*args, *env_args, *image, "python3", "-I", "-S", "-c", BOOT_CODE]
        shim = [sys.executable, "-I", "-S", "-c", FD_SHIM, ",".join(map(str, fds))]
        host_env = sandbox_env(self.owner, slot.sandbox_id, {})
        host_env.update({k: v for k, v in os.environ.items() if k in ("HOME", "XDG_RUNTIME_DIR", "CONTAINERS_CONF")})
        return Command([*shim, *run], host_env, slot.directory, pass_fds=fds[1:])

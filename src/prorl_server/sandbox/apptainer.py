"""The Apptainer (Singularity) runtime: each sandbox is one `apptainer exec` of a .sif or directory image.

The command is `apptainer exec --containall --cleanenv` (new PID, IPC and mount namespaces, nothing of the
host but what is bound) with `--net --network none` unless the spec asks for the host network, and
`--fakeroot` on request, else `--no-privs` (no capabilities, no_new_privs). A server running as root runs
its sandboxes as an unprivileged uid (`run_as`, `--security uid:N,gid:N`): apptainer's uid 0 would be the
host's root, which may write host-wide settings such as /proc/sys/kernel/core_pattern. For the same
reason a root server refuses `fakeroot` (apptainer maps a root caller's fake root to the real one).

The container's root is writable through an overlay: a sparse ext3 image of `limits.disk_mb` (a sparse copy of
one mkfs.ext3 made once per size and working directory) or, with `disk_mb=None`, a host directory. The working
directory (also $HOME), /tmp and /var/tmp live in it. The execution server serves a listening socket the host
made and passed down as a descriptor (no host directory is bound for it); with `host_tools` a copy of this
host's execution-server packages (compiled to bytecode once) appears read-only at /.prorl and comes first on
the server's sys.path, so plain images (python3 only) work and the server always speaks this host's protocol.
A .sif image is unpacked once into a directory under the cache directory and run from there (`unpack_sif`): a
fresh squashfs mount starts with a cold page cache, which costs every start about 100 ms of decompressing
Python.

The environment is scrubbed (--cleanenv); the container's variables, owner tags included, are passed as
APPTAINERENV_*, so every process inside carries PRORL_SANDBOX_OWNER (apptainer's own `starter` and
`appinit` do not; they exit with the container). Limits: rlimits by the bootstrap, pids/memory/cpu by the
sandbox's cgroups (joined before apptainer starts; apptainer's --memory, --pids-limit and --cpus would need
systemd or extra configuration), disk by the overlay's size. See docs/sandboxes.md.
"""

from __future__ import annotations

import asyncio
import compileall
import errno
import fcntl
import hashlib
import os
import re
import shutil
import subprocess
import threading
import time
from pathlib import Path

from prorl_server.sandbox.base import Sandbox
from prorl_server.sandbox.confinement import boot_source, seccomp_program
from prorl_server.sandbox.errors import SandboxError
from prorl_server.sandbox.limits import BOOT_CODE, ENV_BOOT, MB, boot_settings, rlimits
from prorl_server.sandbox.loopback import ENV_ADDRESS
from prorl_server.sandbox.private_dir import ensure_private_dir, user_dir
from prorl_server.sandbox.process import sandbox_env, sandbox_user
from prorl_server.sandbox.process_sandbox import ProcessRuntime, ProcessSandbox
from prorl_server.sandbox.slot import TOOL_PACKAGES, Command, Slot, package_dir, server_args
from prorl_server.sandbox.snapshot import Snapshot
from prorl_server.sandbox.spec import SandboxSpec

ENV_BINARY = "PRORL_APPTAINER"  # path of the apptainer binary; else `apptainer`, then `singularity` on PATH
LIB_DIR = "/.prorl"
NOT_FOUND = (
    "apptainer not found: install Apptainer (as root on Debian bookworm: `bash scripts/setup-apptainer.sh`) "
    f"and put `apptainer` or `singularity` on PATH, or set {ENV_BINARY}=/path/to/apptainer"
)
SBIN = ("/usr/sbin", "/sbin")
PYTHONS = ("usr/bin/python3", "usr/local/bin/python3", "bin/python3")  # where a directory image has python3
CACHE_DIR = user_dir("/var/tmp/prorl-server")  # unpacked and built images (private); apptainer must see it


def find_apptainer() -> str | None:
    """The apptainer binary: $PRORL_APPTAINER, else `apptainer` or `singularity` on PATH."""
    configured = os.environ.get(ENV_BINARY)
    if configured:
        return configured if os.access(configured, os.X_OK) else None
    return shutil.which("apptainer") or shutil.which("singularity")


def stage_tool_packages(dest: Path) -> Path:
    """Copy what `python3 -m prorl_server.tool_server` imports to dest: prorl_server's __init__, _version, errors
    and tool_server, and ptyprocess."""
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    dest.mkdir(parents=True, exist_ok=True)
    for name in TOOL_PACKAGES:
        shutil.rmtree(dest / name, ignore_errors=True)
    server = package_dir("prorl_server")
    (dest / "prorl_server").mkdir()
    for module in (
        "__init__.py",
        "_version.py",
        "errors.py",
    ):  # the root (errors: the execution server raises ProrlErrors)
        shutil.copy2(server / module, dest / "prorl_server" / module)
    shutil.copytree(server / "tool_server", dest / "prorl_server" / "tool_server", ignore=ignore)
    shutil.copytree(package_dir("ptyprocess"), dest / "ptyprocess", ignore=ignore)
    # The bytecode too: the copy is bound read-only, so without it every sandbox's Python compiles the execution
    # server from source at each start (20-35 ms of a start on 2 cores, 1.5 ms with it). Used by an image
    # Python of this host's version (other versions look for their own tag and compile as before).
    compileall.compile_dir(dest, quiet=2)
    return dest


def bare_exec_seconds(image: str, runs: int = 10, binary: str | None = None) -> list[float]:
    """Wall time of each of `runs` `apptainer exec IMAGE true`: the floor a sandbox start compares with."""
    command = [binary or find_apptainer() or "apptainer", "exec", image, "true"]
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        subprocess.run(command, check=True, stdin=subprocess.DEVNULL, capture_output=True)
        times.append(time.perf_counter() - started)
    return times


def unpacked_path(image: Path, cache_dir: Path) -> Path:
    """Where `unpack_sif` puts the contents of `image`: a name from its path, size and mtime."""
    info = image.stat()
    name = hashlib.sha256(f"{image.resolve()}:{info.st_size}:{info.st_mtime_ns}".encode()).hexdigest()[:16]
    return cache_dir / "unpacked" / name


def unpack_sif(image: Path, cache_dir: Path, binary: str) -> Path:
    """A directory with the contents of a .sif image, made once per image path, size and mtime."""
    ensure_private_dir(cache_dir)
    target = unpacked_path(image, cache_dir)
    name = target.name
    if target.is_dir():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if target.is_dir():
            return target
        partial = target.with_name(f"{name}.partial")
        done = subprocess.run(
            [binary, "build", "--force", "--sandbox", str(partial), str(image)],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
        )
        if done.returncode != 0:
            shutil.rmtree(partial, ignore_errors=True)
            raise SandboxError(
                f"cannot unpack {image} into {partial} (run it as a .sif with unpack_sif=False): "
                f"{done.stderr.strip()[-2000:]}"
            )
        partial.rename(target)
    return target


def env_value(value: str) -> str:
    """A value for APPTAINERENV_*: apptainer expands $, `...` and backslashes in it, so escape those."""
    return re.sub(r"([\\$`])", r"\\\1", value)


def copy_sparse(source: Path, target: Path) -> None:
    """Copy `source` to a new file `target`, only its data extents (SEEK_DATA/SEEK_HOLE): holes stay holes."""
    with open(source, "rb") as src, open(target, "xb") as dst:
        size = os.fstat(src.fileno()).st_size
        offset = 0
        while offset < size:
            try:
                data = os.lseek(src.fileno(), offset, os.SEEK_DATA)
            except OSError as exc:
                if exc.errno != errno.ENXIO:  # ENXIO: nothing but a hole after offset
                    raise
                break
            end = os.lseek(src.fileno(), data, os.SEEK_HOLE)
            while data < end:
                copied = os.copy_file_range(src.fileno(), dst.fileno(), end - data, data, data)
                if copied == 0:
                    raise OSError(f"{source} changed while it was copied")
                data += copied
            offset = end
        dst.truncate(size)


def _mkfs_ext3() -> str | None:
    """mkfs.ext3 from e2fsprogs (often in sbin, which is not on every user's PATH)."""
    path = os.pathsep.join([os.environ.get("PATH", ""), *SBIN])
    return shutil.which("mkfs.ext3", path=path)


class ApptainerRuntime(ProcessRuntime):
    """Starts Apptainer sandboxes for one server instance (`owner`).

    `binary`: the apptainer (or singularity) executable (default: `find_apptainer()`). `host_tools`: bind
    this host's execution server into the container (False: the image must have it, as the images of
    `prorl-server build-image` do). `unpack_sif`: run .sif images from a directory unpacked once under
    `cache_dir` (see the module docstring). `run_as`: the uid and gid sandboxes run as when this process is
    root (default: `process.SANDBOX_UID`).
    """

    name = "apptainer"

    def __init__(
        self,
        owner: str,
        *,
        binary: str | None = None,
        host_tools: bool = True,
        unpack_sif: bool = True,
        cache_dir: Path = CACHE_DIR,
        run_as: int | None = None,
        **options,
    ) -> None:
        super().__init__(owner, **options)
        found = binary or find_apptainer()
        if found is None:
            raise SandboxError(NOT_FOUND)
        self.binary = found
        self.host_tools = host_tools
        self.unpack_sif = unpack_sif
        self.cache_dir = cache_dir
        self.run_as = (run_as or sandbox_user()) if os.geteuid() == 0 else None
        self._mkfs = _mkfs_ext3()
        self._nproc = os.geteuid() != 0 and not any("pids" in h.controllers for h in self.cgroups)
        self._lib_lock = threading.Lock()
        self._overlay_lock = threading.Lock()
        self._overlay_templates: dict[tuple[int, str], Path] = {}  # (disk_mb, workdir) -> a fresh ext3 overlay

    @classmethod
    def available(cls) -> str | None:
        """None if an apptainer binary is found, else how to get one."""
        return None if find_apptainer() else NOT_FOUND

    def prepare(self, image: str) -> Path:
        """The image apptainer runs for `image`: the unpacked directory of a .sif (made now if missing)."""
        path = Path(image)
        if not self.unpack_sif or not path.is_file():
            return path
        return unpack_sif(path, self.cache_dir, self.binary)

    async def start(self, spec: SandboxSpec, *, fork: Snapshot | None = None) -> Sandbox:
        """Unpack the image on first use (in a thread), then start as every process runtime does."""
        if spec.image is not None:
            await asyncio.to_thread(self.prepare, spec.image)
        return await super().start(spec, fork=fork)

    def close(self) -> None:
        """Remove the overlay templates too (made again on the next start)."""
        with self._overlay_lock:
            self._overlay_templates.clear()
            shutil.rmtree(self.base_dir / self.owner / "overlays", ignore_errors=True)
        super().close()

    def fork_unavailable(self) -> str | None:
        """None: a fork is apptainer's own stack of overlays (the snapshot read-only below a fresh one)."""
        return None

    async def capture(self, sandbox: ProcessSandbox, directory: Path) -> tuple[str, ...]:
        """End the sandbox's processes, then move its overlay (the ext3 image, or the directory) into
        `directory`: the snapshot's one layer."""
        await sandbox.stop()
        for name in ("overlay.img", "overlay"):
            source = sandbox.slot.directory / name
            if source.exists():
                await asyncio.to_thread(source.rename, directory / name)
                return (name,)
        raise SandboxError(f"sandbox {sandbox.id} has no overlay left to snapshot")

    def _lib(self) -> Path:
        """This owner's copy of the execution-server packages (made on first use; under /tmp so apptainer sees it)."""
        lib = self.base_dir / self.owner / "lib"
        with self._lib_lock:
            if not (lib / "prorl_server" / "tool_server" / "__main__.py").exists():
                stage_tool_packages(lib)
        return lib

    def _overlay(self, spec: SandboxSpec, directory: Path) -> Path:
        """The writable layer: an ext3 image of disk_mb (or a directory if None) holding upper/<workdir>.

        The ext3 image is a sparse copy of a template made once per (disk_mb, workdir) by mkfs.ext3 (a few MB
        of data copied instead of a mkfs process per start)."""
        if spec.limits.disk_mb is None:
            return self._overlay_seed(spec, directory / "overlay")
        key = (spec.limits.disk_mb, spec.workdir)
        with self._overlay_lock:
            template = self._overlay_templates.get(key)
            if template is None or not template.exists():
                template = self._overlay_templates[key] = self._make_overlay_template(spec)
        image = directory / "overlay.img"
        copy_sparse(template, image)
        return image

    def _overlay_seed(self, spec: SandboxSpec, seed: Path) -> Path:
        """The overlay's directory tree: upper/<workdir> (owned by `run_as` if set) and work/."""
        (seed / "upper").mkdir(parents=True)
        (seed / "work").mkdir()
        workdir = seed / "upper" / spec.workdir.lstrip("/")
        workdir.mkdir(parents=True)
        if self.run_as is not None:
            os.chown(workdir, self.run_as, self.run_as)
        return seed

    def _make_overlay_template(self, spec: SandboxSpec) -> Path:
        """A fresh ext3 image of `spec.limits.disk_mb` holding the overlay's tree, in this owner's directory."""
        if self._mkfs is None:
            raise SandboxError("limits.disk_mb needs mkfs.ext3 on the host (install e2fsprogs) or disk_mb=None")
        templates = self.base_dir / self.owner / "overlays"
        templates.mkdir(mode=0o700, parents=True, exist_ok=True)
        name = hashlib.sha256(f"{spec.limits.disk_mb}:{spec.workdir}".encode()).hexdigest()[:16]
        shutil.rmtree(templates / f"{name}.seed", ignore_errors=True)  # left by an interrupted start
        seed = self._overlay_seed(spec, templates / f"{name}.seed")
        image = templates / f"{name}.img"
        try:
            with open(image, "wb") as f:
                f.truncate(spec.limits.disk_mb * MB)
            made = subprocess.run(
                [self._mkfs, "-q", "-F", "-J", "size=4", "-d", str(seed), str(image)], capture_output=True, text=True
            )
            if made.returncode != 0:
                image.unlink()
                raise SandboxError(f"mkfs.ext3 of the {spec.limits.disk_mb} MB overlay failed: {made.stderr.strip()}")
        finally:
            shutil.rmtree(seed, ignore_errors=True)
        return image

    def apptainer_args(self, spec: SandboxSpec, directory: Path, fork: Snapshot | None = None) -> list[str]:
        """The apptainer command line up to (not including) the command run inside; a fork's snapshot is a
        read-only overlay below its own writable one."""
        if spec.image is None:
            raise SandboxError("the apptainer runtime needs spec.image: a .sif file or a directory image")
        if not os.path.exists(spec.image):
            raise SandboxError(f"image {spec.image} does not exist (build one: `prorl-server build-image python`)")
        image = self.prepare(spec.image)
        if image.is_dir() and not any((image / p).exists() for p in PYTHONS):
            raise SandboxError(f"image {spec.image} has no python3, which runs the execution server; add it")
        args = [self.binary, "exec", "--containall", "--cleanenv", "--no-mount", "tmp,home"]
        args += ["--pwd", spec.workdir]
        if fork is not None:
            lower = str(fork.layer(0))
            if any(c in lower for c in ":,"):
                raise SandboxError(f"apptainer cannot overlay paths with ':' or ',': {lower}")
            args += ["--overlay", f"{lower}:ro"]
        args += ["--overlay", str(self._overlay(spec, directory))]
        if spec.network == "none":
            args += ["--net", "--network", "none"]
        if spec.fakeroot and self.run_as is not None:
            raise SandboxError(
                "apptainer cannot give a server running as root a safe fakeroot sandbox (its root would be the "
                "host's root); run the server as a normal user, or use the bwrap runtime, for fakeroot"
            )
        args.append("--fakeroot" if spec.fakeroot else "--no-privs")
        if self.run_as is not None:
            args += ["--security", f"uid:{self.run_as},gid:{self.run_as}"]
        for bind in spec.binds:
            if any(c in bind.source + bind.target for c in ":,"):
                raise SandboxError(f"apptainer cannot bind paths with ':' or ',': {bind.source} -> {bind.target}")
            if not os.path.exists(bind.source):
                raise SandboxError(f"bind source {bind.source} does not exist on the host")
            args += ["--bind", f"{bind.source}:{bind.target}:{'ro' if bind.read_only else 'rw'}"]
        args += ["--bind", "/proc/sys:/proc/sys:ro"]  # sysctls: read-only for every user, fake root included
        if self.host_tools:
            args += ["--bind", f"{self._lib()}:{LIB_DIR}:ro"]
        return [*args, str(image)]

    def environment(
        self, spec: SandboxSpec, slot: Slot, address: str | None, landlock_fd: int | None = None
    ) -> dict[str, str]:
        """apptainer's own environment: tagged, with the container's variables as APPTAINERENV_*; the bootstrap
        confines itself (Landlock with `landlock_fd`, seccomp)."""
        server = server_args(spec, slot, spec.workdir)
        limits, path = rlimits(spec.limits, nproc=self._nproc), [LIB_DIR] if self.host_tools else []
        boot = boot_settings(limits, path, server, pre=boot_source(landlock_fd, seccomp_program()))
        extra = {"TMPDIR": "/tmp", **({ENV_ADDRESS: address} if address else {}), **spec.env, ENV_BOOT: boot}
        inside = sandbox_env(self.owner, slot.sandbox_id, extra)
        if "PATH" not in spec.env:
            del inside["PATH"]  # the host's PATH means nothing in the image; apptainer sets the image's default
        inside.pop("HOME", None)  # see command()
        env = sandbox_env(self.owner, slot.sandbox_id, {})
        env.update({k: v for k, v in os.environ.items() if k == "HOME" or k.startswith(("APPTAINER_", "SINGULARITY_"))})
        env.update({f"APPTAINERENV_{k}": env_value(v) for k, v in inside.items()})
        return env

    def command(self, spec: SandboxSpec, slot: Slot, address: str | None, landlock_fd: int | None) -> Command:
        """apptainer exec of the rlimit bootstrap that runs the execution server."""
        # HOME through env(1): apptainer refuses to set it from APPTAINERENV_HOME, and --home under --security
        args = self.apptainer_args(spec, slot.directory, slot.fork)
        # -S (no site-packages scan, some ms of each start) when the server comes from the host's copy; the IPython
        # tool adds site-packages on its first use (ipython_kernel.import_jupyter_client)
        python = ["python3", "-I", "-S"] if self.host_tools else ["python3", "-I"]
        argv = [*args, "env", f"HOME={spec.workdir}", *python, "-c", BOOT_CODE]
        fds = () if landlock_fd is None else (landlock_fd,)
        return Command(argv, self.environment(spec, slot, address, landlock_fd), slot.directory, pass_fds=fds)

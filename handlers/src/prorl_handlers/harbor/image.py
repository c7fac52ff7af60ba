"""A task's image: environment/Dockerfile converted and built for Apptainer (cached), unpacked to a root
directory that Apptainer, bubblewrap and Podman (`--rootfs`) run.

Harbor's containers run as root, so an agent may change anything; a sandbox here runs as an unprivileged user,
for whom the image's files (made by a root build) are read-only. So the build ends with one more step: the
Dockerfile's WORKDIR is packed into `WORKSPACE_TAR` and emptied, and each sandbox unpacks it again as its own
user into its writable working directory (`unpack_command`), where the agent may change everything, within
the sandbox's storage limit.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from prorl_handlers.harbor.task import HarborTask, TaskError
from prorl_server.imaging import (
    STEP,
    Conversion,
    DockerfileError,
    ImageBuilder,
    ImageBuildError,
    build_dockerfile,
    convert,
)
from prorl_server.sandbox import SandboxError, unpack_sif

WORKSPACE_TAR = "/opt/prorl/harbor/workspace.tar"
RESERVED = ("/proc", "/sys", "/dev", "/tmp", "/var/tmp", "/run", "/opt/prorl", "/logs", "/tests", "/solution")


@dataclass(frozen=True)
class TaskImage:
    """A built task image: the root directory a sandbox runs, and the working directory the agent works in."""

    root: Path
    workdir: str
    cached: bool  # the image was built before
    seconds: float  # building (or finding) it


def conversion(task: HarborTask, base_map: Mapping[str, Path]) -> Conversion:
    """The task's Dockerfile converted (DockerfileError naming the line of what cannot be), with its WORKDIR
    checked: the agent's working directory, not / nor a directory the sandbox or this handler mounts."""
    try:
        converted = convert(task.dockerfile, base_map=base_map)
    except DockerfileError as exc:
        raise TaskError(str(exc)) from exc
    workdir = PurePosixPath(converted.workdir)
    if workdir == PurePosixPath("/") or any(workdir.is_relative_to(path) for path in RESERVED):
        raise TaskError(
            f"{task.dockerfile}: WORKDIR {converted.workdir} cannot be the agent's working directory; set a "
            f"WORKDIR such as /app (not /, nor under {', '.join(RESERVED)})"
        )
    return converted


def build(builder: ImageBuilder, task: HarborTask, base_map: Mapping[str, Path], mirror: str) -> TaskImage:
    """Build (or reuse) the task's image within its build_timeout_sec, and its unpacked root directory."""
    converted = conversion(task, base_map)
    quoted = shlex.quote(converted.workdir)
    converted.steps += [
        f"echo '{STEP} end'",  # what follows is this handler's, not a line of the Dockerfile
        f"mkdir -p {shlex.quote(str(PurePosixPath(WORKSPACE_TAR).parent))}",
        f"tar -C {quoted} -cf {WORKSPACE_TAR} .",
        f"find {quoted} -mindepth 1 -delete",
    ]
    built = build_dockerfile(builder, converted, mirror=mirror, timeout_s=task.config.environment.build_timeout_sec)
    try:
        root = unpack_sif(built.path, builder.cache_dir, str(builder.binary))
    except SandboxError as exc:
        raise ImageBuildError(str(exc)) from exc
    return TaskImage(root, converted.workdir, built.cached, built.seconds)


def unpack_command(workdir: str, archive: str = WORKSPACE_TAR) -> str:
    """The shell command that fills the (empty) working directory from `archive`, as the sandbox's user."""
    return f"tar -C {shlex.quote(workdir)} -xpf {shlex.quote(archive)}"

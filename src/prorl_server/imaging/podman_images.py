"""Images for the podman runtime, in podman's local storage, named by the hash of what they are made from.

- `import_rootfs(root)`: a root filesystem directory (a debootstrap, an unpacked image) as
  `localhost/prorl-rootfs:<key>`, `tar -c | podman import`; the key is `images.base_identity` of the
  directory (every entry's path, mode, size and mtime), so a changed directory is imported again.
- `build_dockerfile(dockerfile, ...)`: `podman build` of a Dockerfile as `localhost/prorl-dockerfile:<key>`,
  the key covering the Dockerfile's bytes, its context's content (`images.tree_sha256`), the build
  arguments and the base. Podman reads the Dockerfile itself (no conversion: every instruction podman knows
  works). A registry is never asked (`--pull never`): the first `FROM` may be mapped to a local root directory
  (`base_map`, imported first and given to `podman build --from`); other bases must already be in local
  storage. RUN steps have the host network (`--network host`, for apt and pip). A failed build is an
  ImageBuildError naming the Dockerfile's line; podman tags an image only once its build succeeded, and
  `--layers=false --force-rm` keeps no intermediate image or container, so nothing half-built is left.

An image already in local storage under its key is reused (`PodmanImage.cached`).
"""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from prorl_server.imaging.dockerfile import read_instructions
from prorl_server.imaging.images import IMAGE_CACHE_DIR, ImageBuildError, base_identity, tree_sha256
from prorl_server.sandbox import ensure_private_dir, podman_command

ROOTFS_REPO = "localhost/prorl-rootfs"
DOCKERFILE_REPO = "localhost/prorl-dockerfile"
STEP = re.compile(r"^\[\d+/\d+\] STEP (?P<step>\d+)/\d+: (?P<text>.*)$|^STEP (?P<plain>\d+)/\d+: (?P<ptext>.*)$", re.M)
LOG_TAIL = 2000


@dataclass(frozen=True)
class PodmanImage:
    """An image in podman's local storage: its reference (`SandboxSpec.image`), whether it was there already,
    the seconds it took, its key and working directory (the image's WORKDIR, `/` without one)."""

    reference: str
    cached: bool
    seconds: float
    key: str
    workdir: str


def _key(inputs: dict[str, object]) -> str:
    return hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()[:16]


def _podman(*args: str, timeout_s: float | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*podman_command(), *args], stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout_s
    )


def _exists(reference: str) -> bool:
    return _podman("image", "exists", reference).returncode == 0


def _workdir(reference: str) -> str:
    done = _podman("image", "inspect", "--format", "{{.Config.WorkingDir}}", reference)
    return done.stdout.strip() or "/"


def import_rootfs(root: Path) -> PodmanImage:
    """The root directory `root` as an image (imported now unless it was, unchanged, before)."""
    started = time.perf_counter()
    if not (root / "usr").is_dir():
        raise ImageBuildError(f"{root} is not a root filesystem directory (it has no usr/)")
    key = _key({"rootfs": base_identity(root)})
    reference = f"{ROOTFS_REPO}:{key}"
    cached = _exists(reference)
    if not cached:
        tar = subprocess.Popen(["tar", "-C", str(root), "-c", "."], stdout=subprocess.PIPE)
        done = subprocess.run(
            [*podman_command(), "import", "-q", "-", reference], stdin=tar.stdout, capture_output=True, text=True
        )
        assert tar.stdout is not None
        tar.stdout.close()
        if tar.wait() != 0 or done.returncode != 0:
            _podman("rmi", "--ignore", reference)
            raise ImageBuildError(f"cannot import {root} into podman: {done.stderr.strip()[-LOG_TAIL:]}")
    return PodmanImage(reference, cached, time.perf_counter() - started, key, "/")


def build_dockerfile(
    dockerfile: Path,
    context: Path | None = None,
    build_args: Mapping[str, str] | None = None,
    base_map: Mapping[str, Path] | None = None,
    cache_dir: Path = IMAGE_CACHE_DIR,
) -> PodmanImage:
    """Build (or reuse) the image of a Dockerfile with `podman build`; `base_map` maps the first FROM's image
    to a local root directory. ImageBuildError names the Dockerfile's line a failed build stopped at; the
    full log is in `cache_dir/podman-<key>.log`."""
    started = time.perf_counter()
    context = context or dockerfile.parent
    if not dockerfile.is_file():
        raise ImageBuildError(f"{dockerfile}: no such Dockerfile")
    if not context.is_dir():
        raise ImageBuildError(f"{context}: the build context is not a directory")
    instructions = read_instructions(dockerfile, dockerfile.read_text())
    froms = [i for i in instructions if i.keyword == "FROM"]
    if not froms:
        raise ImageBuildError(f"{dockerfile}: no FROM instruction")
    first = froms[0].value.split()[0]
    mapped = {k: v for k, v in (base_map or {}).items() if k in {f.value.split()[0] for f in froms}}
    if set(mapped) - {first}:
        raise ImageBuildError(f"{dockerfile}: only the first FROM ({first}) can be mapped to a local root directory")
    base = import_rootfs(mapped[first]).reference if first in mapped else None
    inputs = {
        "dockerfile_sha256": hashlib.sha256(dockerfile.read_bytes()).hexdigest(),
        "context_sha256": tree_sha256(context),
        "build_args": dict(sorted((build_args or {}).items())),
        "base": base or first,
    }
    key = _key(inputs)
    reference = f"{DOCKERFILE_REPO}:{key}"
    if _exists(reference):
        return PodmanImage(reference, True, time.perf_counter() - started, key, _workdir(reference))
    args = ["build", "--pull=never", "--layers=false", "--force-rm", "--network", "host"]
    args += ["-f", str(dockerfile), "-t", reference]
    args += [a for name, value in (build_args or {}).items() for a in ("--build-arg", f"{name}={value}")]
    if base is not None:
        args += ["--from", base]
    done = _podman(*args, str(context))
    if done.returncode != 0:
        ensure_private_dir(cache_dir)
        log = cache_dir / f"podman-{key}.log"
        log.write_text(done.stdout + done.stderr)
        _podman("rmi", "--ignore", reference)
        raise ImageBuildError(f"{_failed_at(dockerfile, instructions, done.stdout + done.stderr)}; log: {log}", log)
    return PodmanImage(reference, False, time.perf_counter() - started, key, _workdir(reference))


def _failed_at(dockerfile: Path, instructions: list, output: str) -> str:
    """`FILE:LINE: KEYWORD failed the build: <end of podman's output>` (the line of podman's last STEP)."""
    tail = output.strip()[-LOG_TAIL:]
    steps = list(STEP.finditer(output))
    if steps:
        number = int(steps[-1]["step"] or steps[-1]["plain"])
        if 0 < number <= len(instructions):
            instruction = instructions[number - 1]
            return f"{dockerfile}:{instruction.line}: {instruction.keyword} failed the build: {tail}"
    return f"{dockerfile}: podman build failed: {tail}"

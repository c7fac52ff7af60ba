"""Apptainer images from the Jinja2 definition templates in templates/ beside this module, cached as .sif files.

A build renders a template (`python`, `swe`, or a path to a `.def.j2` file), stages the execution server
(prorl_server.tool_server and ptyprocess) next to it and runs `apptainer build --fakeroot`. Cache modes:

- `scratch`: always rebuild.
- `versioned`: reuse while the template, its variables, the base image's content and the prorl-server
  version are unchanged.
- `lock`: reuse while the template, its variables and the dependency lockfile (pip requirements, installed
  into the image) are unchanged.

Files a definition copies in (a Dockerfile's COPY sources, imaging/dockerfile.py) are staged with the build
context (`stage`), and their content is part of the key in every mode. `ImageBuilder.explain()` returns the
inputs that make up the key. Behind an intercepting HTTPS proxy, `pip_cert`
(`--pip-cert`, default `$PIP_CERT`) gives the lockfile's pip install a CA bundle, staged with the build
context (an apptainer run through a wrapper may not see the host's path) and removed from the image after. A local base (a .sif or a root directory,
e.g. made with debootstrap) is first copied into a .sif without device nodes, once per base content:
--fakeroot builds cannot create device nodes, and apptainer provides /dev at run time anyway.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import signal
import subprocess
import time
import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import jinja2
import jinja2.meta

from prorl_server._version import __version__
from prorl_server.errors import ImageError
from prorl_server.sandbox import (
    CACHE_DIR,
    NOT_FOUND,
    SandboxError,
    ensure_private_dir,
    find_apptainer,
    stage_tool_packages,
    unpack_sif,
)

CacheMode = Literal["scratch", "versioned", "lock"]
CACHE_MODES: tuple[CacheMode, ...] = ("scratch", "versioned", "lock")
TEMPLATES = Path(__file__).resolve().parent / "templates"
IMAGE_CACHE_DIR = CACHE_DIR / "images"
SUFFIX = ".def.j2"
DEFAULTS: dict[str, Any] = {
    "ipython": True,
    "packages": [],
    "suite": "bookworm",
    "mirror": "http://deb.debian.org/debian",
}
LOG_TAIL = 3000


class ImageBuildError(ImageError, RuntimeError):
    """A template could not be rendered or built; the message says what to change. `log`: the failed build's
    full output, when apptainer ran."""

    def __init__(self, message: str, log: Path | None = None) -> None:
        super().__init__(message)
        self.log = log


@dataclass(frozen=True)
class BuiltImage:
    """The result of `ImageBuilder.build`."""

    path: Path
    cached: bool  # True: an earlier build was reused
    seconds: float
    key: str | None  # None in scratch mode
    inputs: dict[str, Any] = field(default_factory=dict)


def _sha256_file(path: Path) -> str:
    """Hex SHA-256 of a file's bytes."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def tree_sha256(path: Path) -> str:
    """SHA-256 of a file's bytes, or of a directory's entries (relative path, mode, bytes or link target)."""
    if not path.is_dir() or path.is_symlink():
        return _sha256_file(path)
    digest = hashlib.sha256()
    for top, dirs, files in os.walk(path):
        dirs.sort()
        for name in sorted(files) + dirs:
            entry = Path(top, name)
            info = entry.lstat()
            digest.update(f"{entry.relative_to(path)}\0{info.st_mode}\0".encode())
            if entry.is_symlink():
                digest.update(os.readlink(entry).encode())
            elif entry.is_file():
                digest.update(bytes.fromhex(_sha256_file(entry)))
            digest.update(b"\n")
    return digest.hexdigest()


def base_identity(base: Path) -> str:
    """SHA-256 of a .sif's bytes, or of a root directory's listing (path, mode, size, mtime of each entry)."""
    if base.is_file():
        return _sha256_file(base)
    if not base.is_dir():
        raise ImageBuildError(f"base image {base} does not exist (a .sif file or a root directory)")
    digest = hashlib.sha256()
    for top, dirs, files in os.walk(base):
        dirs.sort()
        for name in sorted(files) + dirs:
            info = os.lstat(os.path.join(top, name))
            rel = os.path.relpath(os.path.join(top, name), base)
            digest.update(f"{rel}\0{info.st_mode}\0{info.st_size}\0{info.st_mtime_ns}\n".encode())
    return digest.hexdigest()


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    """An exclusive lock on `path` (created if missing) across threads and processes."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        yield


class ImageBuilder:
    """Renders definition templates and builds them into cached .sif files under `cache_dir`.

    `cache_dir` must be a path apptainer sees (e.g. under /tmp, /var/tmp or /home for the wrapper that
    scripts/setup-apptainer.sh installs).
    """

    def __init__(
        self, cache_dir: Path = IMAGE_CACHE_DIR, binary: str | None = None, templates: Path = TEMPLATES
    ) -> None:
        if cache_dir.is_relative_to(CACHE_DIR):  # the default place, under a shared /var/tmp
            ensure_private_dir(CACHE_DIR)
        self.cache_dir = cache_dir
        self.binary = binary or find_apptainer()
        self.templates = templates

    def _environment(self, template: str) -> tuple[jinja2.Environment, str]:
        """A Jinja2 environment that finds `template` (a name in `templates` or a file path) and its name."""
        path = Path(template)
        search = [str(self.templates)]
        if path.suffix == ".j2" or path.exists():
            if not path.is_file():
                raise ImageBuildError(f"template file {template} does not exist")
            search.insert(0, str(path.resolve().parent))
            name = path.name
        else:
            name = template + SUFFIX
            if not (self.templates / name).is_file():
                known = sorted(p.name.removesuffix(SUFFIX) for p in self.templates.glob(f"*{SUFFIX}"))
                raise ImageBuildError(f"no template {template!r}; built-in: {', '.join(known)}, or a path to a .j2")
        env = jinja2.Environment(
            loader=jinja2.FileSystemLoader(search),
            undefined=jinja2.StrictUndefined,
            keep_trailing_newline=True,
            autoescape=False,
        )
        return env, name

    def template_sha256(self, template: str) -> str:
        """SHA-256 over the source of the template and every template it extends or includes."""
        env, name = self._environment(template)
        digest = hashlib.sha256()
        pending, seen = [name], set()
        while pending:
            current = pending.pop()
            if current in seen:
                continue
            seen.add(current)
            source = env.loader.get_source(env, current)[0]  # type: ignore[union-attr]
            digest.update(f"{current}\0{source}\0".encode())
            pending += [t for t in jinja2.meta.find_referenced_templates(env.parse(source)) if t]
        return digest.hexdigest()

    def render(self, template: str, **variables: Any) -> str:
        """The definition file text of `template` with DEFAULTS updated by `variables`."""
        env, name = self._environment(template)
        values = {**DEFAULTS, "template": Path(name).name.removesuffix(SUFFIX), **variables}
        try:
            return env.get_template(name).render(**values)
        except jinja2.TemplateError as exc:
            raise ImageBuildError(f"cannot render {name}: {exc}") from exc

    def explain(
        self,
        template: str,
        mode: CacheMode = "versioned",
        base: Path | None = None,
        lockfile: Path | None = None,
        stage: Mapping[str, Path] | None = None,
        **variables: Any,
    ) -> dict[str, Any]:
        """The inputs the cache key is made of in `mode` (in scratch mode: those of versioned, not used)."""
        if mode not in CACHE_MODES:
            raise ImageBuildError(f"unknown cache mode {mode!r}; choose one of {', '.join(CACHE_MODES)}")
        inputs: dict[str, Any] = {
            "mode": mode,
            "template": template,
            "template_sha256": self.template_sha256(template),
            "variables": {**DEFAULTS, **variables},
            "base": str(base) if base else None,
        }
        if stage:
            inputs["staged_sha256"] = {name: tree_sha256(path) for name, path in sorted(stage.items())}
        if mode == "lock":
            if lockfile is None:
                raise ImageBuildError("cache mode 'lock' needs a lockfile (pip requirements with pinned versions)")
            inputs.update(lockfile=str(lockfile), lockfile_sha256=_sha256_file(lockfile))
        else:
            inputs.update(
                base_sha256=base_identity(base) if base else None,
                prorl_server_version=__version__,
                lockfile=str(lockfile) if lockfile else None,
            )
        return inputs

    @staticmethod
    def key(inputs: dict[str, Any]) -> str:
        """The cache key of a set of inputs."""
        return hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()[:16]

    def build(
        self,
        template: str,
        mode: CacheMode = "versioned",
        base: Path | None = None,
        lockfile: Path | None = None,
        out: Path | None = None,
        pip_cert: Path | None = None,
        stage: Mapping[str, Path] | None = None,
        timeout_s: float | None = None,
        **variables: Any,
    ) -> BuiltImage:
        """Build (or reuse) the image of `template`; with `out`, also place it there (hard link or copy).

        `pip_cert`: a CA bundle the lockfile's `pip install` verifies HTTPS with (a network whose HTTPS goes
        through an intercepting proxy); used by that step only, not left in the image, not in the cache key.
        `stage`: host files or directories copied into the build context under these relative names.
        `timeout_s`: seconds `apptainer build` may take (the base's preparation not counted); past it the
        build is killed and fails."""
        started = time.perf_counter()
        if self.binary is None:
            raise ImageBuildError(NOT_FOUND)
        inputs = self.explain(template, mode, base, lockfile, stage, **variables)
        name = Path(template).name.removesuffix(SUFFIX)
        key = None if mode == "scratch" else self.key(inputs)
        target = self.cache_dir / (f"{name}-scratch.sif" if key is None else f"{name}-{key}.sif")
        with _locked(target.with_suffix(".lock")):
            cached = key is not None and target.is_file()
            if not cached:
                self._build(template, target, base, lockfile, pip_cert, stage or {}, variables, timeout_s)
                target.with_suffix(".json").write_text(json.dumps(inputs, indent=2, sort_keys=True) + "\n")
        if out is not None:
            _place(target, out)
        return BuiltImage(out or target, cached, time.perf_counter() - started, key, inputs)

    def clean_base(self, base: Path) -> Path:
        """A .sif of `base` (a .sif or a root directory) without device nodes, made once per base content."""
        target = self.cache_dir / "bases" / f"{base_identity(base)[:16]}.sif"
        with _locked(target.with_suffix(".lock")):
            if target.is_file():
                return target
            work = self.cache_dir / "tmp" / uuid.uuid4().hex
            try:
                try:
                    root = unpack_sif(base, work, str(self.binary)) if base.is_file() else base
                except SandboxError as exc:
                    raise ImageBuildError(str(exc)) from exc
                partial = target.with_suffix(".partial")
                self._run(["build", "--force", "--mksquashfs-args", "-wildcards -e dev/*", str(partial), f"{root}/"])
                partial.rename(target)
            finally:
                shutil.rmtree(work, ignore_errors=True)
        return target

    def _build(
        self,
        template: str,
        target: Path,
        base: Path | None,
        lockfile: Path | None,
        pip_cert: Path | None,
        stage: Mapping[str, Path],
        variables: dict[str, Any],
        timeout_s: float | None = None,
    ) -> None:
        """Render into a fresh build directory and run apptainer build; the result replaces `target` atomically."""
        work = self.cache_dir / "tmp" / uuid.uuid4().hex
        context = stage_tool_packages(work / "context")
        try:
            if lockfile is not None:
                shutil.copyfile(lockfile, context / "requirements.lock")
            if pip_cert is not None:  # staged, since apptainer may not see the host's path (a wrapper's root)
                shutil.copyfile(pip_cert, context / "pip-cert.pem")
            for name, source in stage.items():
                (context / name).parent.mkdir(parents=True, exist_ok=True)
                if source.is_dir():
                    shutil.copytree(source, context / name, symlinks=True)
                else:
                    shutil.copy2(source, context / name)
            definition = self.render(
                template,
                **variables,
                base=str(self.clean_base(base)) if base else None,
                context=str(context),
                lockfile=lockfile is not None,
                pip_cert=pip_cert is not None,
            )
            (work / "image.def").write_text(definition)
            partial = work / "image.sif"
            self._run(
                ["build", "--fakeroot", "--force", str(partial), str(work / "image.def")],
                target.with_suffix(".log"),
                timeout_s,
            )
            os.replace(partial, target)
        finally:
            shutil.rmtree(work, ignore_errors=True)

    def _run(self, args: list[str], log: Path | None = None, timeout_s: float | None = None) -> None:
        """Run apptainer (its whole process group killed after `timeout_s`); on failure raise ImageBuildError
        with the end of its output."""
        with subprocess.Popen(
            [str(self.binary), *args],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=timeout_s is not None,  # a group of its own to kill; else Ctrl-C reaches it
        ) as process:
            try:
                stdout, _ = process.communicate(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                stdout, _ = process.communicate()
                stdout += f"\nkilled after {timeout_s:g} s, the build's timeout\n".encode()
        output = stdout.decode(errors="replace")
        if log is not None:
            log.write_text(output)
        if process.returncode != 0:
            where = f" (full log: {log})" if log is not None else ""
            raise ImageBuildError(
                f"apptainer {' '.join(args[:2])} failed with exit status {process.returncode}{where}:\n{output[-LOG_TAIL:]}",
                log,
            )


def _place(image: Path, out: Path) -> None:
    """Put a built image at `out`: a hard link where possible, else a copy (replacing `out` atomically)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_name(f".{out.name}.{uuid.uuid4().hex[:8]}")
    try:
        os.link(image, partial)
    except OSError:
        shutil.copy2(image, partial)
    os.replace(partial, out)

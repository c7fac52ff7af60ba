"""Installing a harness, pinned, into a directory of its own that sandboxes get read-only (`HARNESS_MOUNT`).

`install(harness)` puts `<root>/<name>-<version>/` in place once (npm packages with the host's npm, PyPI
packages into a virtual environment of the host's Python, or of one new enough for the package: see
`find_python`) and is a no-op when it is there; `installed()` finds it. The root is `$PRORL_HARNESS_ROOT`,
else `~/.cache/prorl-server/harnesses`. A partial install never counts: it is built beside its place and
renamed into it when complete.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from prorl_handlers.errors import BundledHandlerError
from prorl_handlers.harnesses.base import Harness

ROOT_ENV = "PRORL_HARNESS_ROOT"
PYTHON_ENV = "PRORL_HARNESS_PYTHON"
NEWEST_MINOR = 14  # the newest python3.N looked for on PATH
MARKER = ".prorl-harness"
INSTALL_TIMEOUT_S = 1800.0
QUIET_NPM = {
    "npm_config_update_notifier": "false",
    "npm_config_fund": "false",
    "npm_config_audit": "false",
    "npm_config_loglevel": "error",
}


class HarnessInstallError(BundledHandlerError, RuntimeError):
    """A harness could not be installed (its package client's own message is in it)."""


class HarnessNotInstalled(BundledHandlerError, LookupError):
    """A job names a harness that is not installed on this server; the message says how to install it."""


def harness_root() -> Path:
    """Where harnesses are installed: `$PRORL_HARNESS_ROOT`, else `~/.cache/prorl-server/harnesses`."""
    configured = os.environ.get(ROOT_ENV)
    return Path(configured) if configured else Path.home() / ".cache" / "prorl-server" / "harnesses"


def install_dir(harness: type[Harness], root: Path | None = None) -> Path:
    """The directory `harness` is (or would be) installed in."""
    return (root or harness_root()) / f"{harness.name}-{harness.package.version}"


def install_record(harness: type[Harness], root: Path | None = None) -> dict[str, Any] | None:
    """What the complete install of `harness` under `root` recorded (`spec`, `packages` with the extra ones,
    `seconds` it took, `mb` on disk), or None when there is none of these versions."""
    marker = install_dir(harness, root) / MARKER
    try:
        text = marker.read_text().strip()
    except OSError:
        return None
    try:
        record = json.loads(text)
    except ValueError:
        return None
    return record if isinstance(record, dict) and record.get("packages") == _specs(harness) else None


def installed(harness: type[Harness], root: Path | None = None) -> Path | None:
    """The complete install of `harness` under `root`, or None."""
    return install_dir(harness, root) if install_record(harness, root) is not None else None


def require_installed(harness: type[Harness], root: Path | None = None) -> Path:
    """`installed()`, or HarnessNotInstalled naming the command that installs it."""
    directory = installed(harness, root)
    if directory is None:
        raise HarnessNotInstalled(
            f"harness {harness.name!r} ({harness.package.spec}) is not installed under {root or harness_root()}: "
            f"run `python -m prorl_handlers.harnesses install {harness.name}` on the server's machine"
        )
    return directory


def install(harness: type[Harness], root: Path | None = None, log: Callable[[str], None] = print) -> Path:
    """Install `harness` (a no-op when installed); returns its directory. HarnessInstallError on failure."""
    root = root or harness_root()
    root.mkdir(parents=True, exist_ok=True)
    with open(root / f".{harness.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        done = installed(harness, root)
        if done is not None:
            return done
        target = install_dir(harness, root)
        staging = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=root))
        started = time.monotonic()
        log(f"installing {harness.package.spec} ({harness.package.ecosystem}) into {target}")
        try:
            if harness.package.ecosystem == "npm":
                _npm_install(harness, staging)
            else:
                _pip_install(harness, staging)
            record = {"spec": harness.package.spec, "packages": _specs(harness)}
            record["seconds"] = round(time.monotonic() - started, 1)
            record["mb"] = round(_size_mb(staging), 1)
            (staging / MARKER).write_text(json.dumps(record) + "\n")
            os.chmod(staging, 0o755)
            if target.exists():
                shutil.rmtree(target)
            staging.rename(target)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        log(f"installed {harness.package.spec} in {record['seconds']:.0f}s ({record['mb']:.0f} MB)")
        return target


def _npm_install(harness: type[Harness], directory: Path) -> None:
    npm = shutil.which("npm")
    if npm is None:
        raise HarnessInstallError(f"{harness.name}: npm is not installed (Debian: apt-get install nodejs npm)")
    argv = [npm, "install", "--prefix", str(directory), "--omit=dev", "--no-save", *_specs(harness)]
    _run(harness, argv, {**os.environ, **QUIET_NPM})


def find_python(harness: type[Harness]) -> str:
    """An interpreter for a PyPI harness: the server's own if new enough for `package.python`, else
    `$PRORL_HARNESS_PYTHON`, `python3.N` on PATH (newest first), then pyenv's; HarnessInstallError if none."""
    least = harness.package.python
    if least is None or sys.version_info[:2] >= _version(least):
        return sys.executable
    names = [f"python3.{minor}" for minor in range(NEWEST_MINOR, _version(least)[1] - 1, -1)]
    candidates = [os.environ.get(PYTHON_ENV), *map(shutil.which, names)]
    candidates += sorted(map(str, Path.home().glob(".pyenv/versions/3.*/bin/python3")), reverse=True)
    for candidate in filter(None, candidates):
        found = _probe(candidate)
        if found is not None and found[0] >= _version(least):
            return found[1]
    raise HarnessInstallError(
        f"{harness.name}: {harness.package.spec} needs Python >= {least} and none was found "
        f"(install python{least} (Debian: apt-get install python{least}-venv; or pyenv install {least}), "
        f"or set {PYTHON_ENV} to one)"
    )


def _version(text: str) -> tuple[int, int]:
    major, minor = text.split(".")[:2]
    return int(major), int(minor)


def _probe(python: str) -> tuple[tuple[int, int], str] | None:
    """The version and executable of interpreter `python` (a pyenv shim names the real one), None if it fails."""
    code = "import sys; print(*sys.version_info[:2], sys.executable)"
    try:
        done = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=30)
        major, minor, executable = done.stdout.split(maxsplit=2)
        return (int(major), int(minor)), executable.strip()
    except (OSError, subprocess.TimeoutExpired, ValueError):
        return None


def _pip_install(harness: type[Harness], directory: Path) -> None:
    _run(harness, [find_python(harness), "-m", "venv", str(directory)], dict(os.environ))
    argv = [str(directory / "bin" / "python"), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    _run(harness, [*argv, *_specs(harness)], dict(os.environ))


def _specs(harness: type[Harness]) -> list[str]:
    """What is installed: the program's spec, then its extra packages'."""
    return [harness.package.spec, *(package.spec for package in harness.extra_packages)]


def _run(harness: type[Harness], argv: list[str], env: dict[str, str]) -> None:
    try:
        done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=INSTALL_TIMEOUT_S)
    except subprocess.TimeoutExpired as exc:
        raise HarnessInstallError(f"{harness.name}: `{' '.join(argv[:3])}` ran past {INSTALL_TIMEOUT_S:g}s") from exc
    if done.returncode != 0:
        tail = (done.stderr or done.stdout)[-3000:]
        raise HarnessInstallError(f"{harness.name}: `{' '.join(argv[:3])} ...` exited {done.returncode}:\n{tail}")


def _size_mb(directory: Path) -> float:
    """Megabytes on disk under `directory`, each file once (npm hard-links a package's binary)."""
    seen: dict[int, int] = {}
    for path in directory.rglob("*"):
        if path.is_file() and not path.is_symlink():
            status = path.stat()
            seen[status.st_ino] = status.st_size
    return sum(seen.values()) / 1e6

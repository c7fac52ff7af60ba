"""The local repository source: no network, no clones.

`<repos_dir>/<repo>/` holds a repository's files. They are uploaded into the sandbox and committed there as
the repository's one commit, with a fixed author, committer and date and no git configuration, so the commit
id is the same wherever and however often it is built: that id is the instances' `base_commit`.
"""

from __future__ import annotations

import asyncio
import shlex
import subprocess
from pathlib import Path

from prorl_handlers.errors import BundledHandlerError
from prorl_server.sandbox import Sandbox

COMMIT_ENV = {
    "GIT_AUTHOR_NAME": "prorl-swe",
    "GIT_AUTHOR_EMAIL": "swe@prorl.invalid",
    "GIT_AUTHOR_DATE": "2024-01-01T00:00:00+0000",
    "GIT_COMMITTER_NAME": "prorl-swe",
    "GIT_COMMITTER_EMAIL": "swe@prorl.invalid",
    "GIT_COMMITTER_DATE": "2024-01-01T00:00:00+0000",
    "GIT_CONFIG_NOSYSTEM": "1",  # no system or user configuration (signing, hooks, line endings) reaches the commit
    "GIT_CONFIG_GLOBAL": "/dev/null",
}
NEVER_IN_PATCHES = ("__pycache__/", "*.pyc", ".pytest_cache/")  # .git/info/exclude, outside the commit
PATCH_FILE = "/tmp/prorl-swe-model.patch"
GIT_TIMEOUT_S = 60.0


class RepositoryError(BundledHandlerError, RuntimeError):
    """A repository is missing, does not build to the instance's base_commit, or its diff failed."""


def repo_dir(repos_dir: Path, repo: str) -> Path:
    """The directory of `repo` under `repos_dir`."""
    root = repos_dir / repo
    if Path(repo).is_absolute() or ".." in Path(repo).parts or not root.is_dir():
        raise RepositoryError(
            f"no repository {repo!r} in {repos_dir}: add its files there, or serve a SWEHandler(repos_dir=...)"
        )
    return root


def repo_files(root: Path) -> dict[str, bytes]:
    """The repository's files by relative path (Python caches left out)."""
    return {
        path.relative_to(root).as_posix(): path.read_bytes()
        for path in sorted(root.rglob("*"))
        if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc"
    }


def commit_command(path: str) -> str:
    """Shell commands committing the files in `path` as the repository's one commit; prints the commit id."""
    env = " ".join(f"{key}={shlex.quote(value)}" for key, value in COMMIT_ENV.items())
    excluded = " ".join(shlex.quote(pattern) for pattern in NEVER_IN_PATCHES)
    return (
        f"(cd {shlex.quote(path)} && export {env} && git init -q -b main && git add -A && "
        f"git commit -q -m 'Initial commit' && printf '%s\\n' {excluded} >> .git/info/exclude && git rev-parse HEAD)"
    )


async def materialize(sandbox: Sandbox, root: Path, path: str, base_commit: str) -> None:
    """Check the repository at `root` out at `path` in the sandbox (its shell is left there) at `base_commit`."""
    files = await asyncio.to_thread(repo_files, root)
    for name, data in files.items():
        await sandbox.tools.upload(f"{path}/{name}", data)
    built = await sandbox.bash(f"{commit_command(path)} && cd {shlex.quote(path)}", timeout=GIT_TIMEOUT_S)
    commit = built.output.strip().rpartition("\n")[2]
    if built.exit_code or commit != base_commit:
        raise RepositoryError(
            f"{root} builds commit {commit!r}, not the instance's base_commit {base_commit!r}: the repository "
            f"files do not match the instance (exit code {built.exit_code}: {built.output.strip()[-500:]})"
        )


async def extract_patch(sandbox: Sandbox, path: str, base_commit: str) -> str:
    """Every change in the checkout at `path` since `base_commit` (new files included) as a git patch."""
    quoted = shlex.quote(path)
    diff = f"git -C {quoted} add -A && git -C {quoted} diff --cached --binary {shlex.quote(base_commit)} > {PATCH_FILE}"
    done = await sandbox.bash(diff, timeout=GIT_TIMEOUT_S)
    if done.exit_code:
        raise RepositoryError(f"git diff failed in {path}: {done.output.strip()[-500:]}")
    return await sandbox.read_file(PATCH_FILE)


def build_local(root: Path, dest: Path) -> str:
    """Build the repository at `root` in the empty directory `dest` on this machine; returns its commit id."""
    for name, data in repo_files(root).items():
        (dest / name).parent.mkdir(parents=True, exist_ok=True)
        (dest / name).write_bytes(data)
    done = subprocess.run(["bash", "-c", commit_command(str(dest))], capture_output=True, text=True, check=True)
    return done.stdout.strip()

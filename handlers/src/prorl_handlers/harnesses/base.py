"""The `Harness` class a preset is: what to install, and how to point the installed program at a session."""

from __future__ import annotations

import shlex
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar, Literal

Dialect = Literal["anthropic", "responses", "chat"]
"""The API a harness speaks: Anthropic Messages, OpenAI Responses, or OpenAI Chat Completions."""

HARNESS_MOUNT = "/.prorl-harness"
"""Where a harness's install directory is bound, read-only, inside the sandbox: at the top, where every runtime
can make the mount point (not under /opt or /usr, which bubblewrap binds read-only from the host or image)."""


@dataclass(frozen=True)
class Package:
    """A harness's program, pinned: an npm package (run by the sandbox's Node.js) or a PyPI one."""

    ecosystem: Literal["npm", "pypi"]
    name: str
    version: str
    python: str | None = None
    """A PyPI package's least Python version (`"3.12"`), when the server's own is too old for it."""

    @property
    def spec(self) -> str:
        """What the package client installs: `name@version` (npm) or `name==version` (pip)."""
        return f"{self.name}@{self.version}" if self.ecosystem == "npm" else f"{self.name}=={self.version}"


@dataclass(frozen=True)
class HarnessRun:
    """One run of a harness in a sandbox, as its preset needs it to write the command and config."""

    task: str
    """The prompt: what the agent is asked to do."""
    model: str
    """The model name the harness asks for (the session answers it)."""
    base_url: str
    """The session's address inside the sandbox, as this harness's dialect wants it (with or without `/v1`)."""
    api_key: str
    """The key the harness sends (a placeholder: the sandbox's bridge adds the session's own)."""
    max_turns: int
    """The most model calls the harness should make, where it has a setting for it."""
    workdir: str
    """The working directory (the task's files are there)."""
    home: str
    """A writable HOME for the harness's config, state and logs."""
    root: str = HARNESS_MOUNT
    """Where the harness is installed inside the sandbox."""
    context_tokens: int | None = None
    """The backend's context length (None: it does not say): a harness told it compacts before it is full."""

    @property
    def quoted_task(self) -> str:
        """The task as one shell word."""
        return shlex.quote(self.task)


class Harness(ABC):
    """A preset: one agent program, pinned, run unmodified against the job's gateway session.

    A subclass names the program (`package`), the API it speaks (`dialect`), the variables (`env`) and the
    files (`files`: config under `run.home`) that point it at the session with telemetry, auto-update and
    every outside host off, and the command line that runs it on `run.task` (`command`). `log_paths` are
    files of its own (under `run.home`) whose ends go into the result. docs/harnesses.md shows one whole.
    """

    name: ClassVar[str]
    """The preset's name: the instance's `harness`."""
    dialect: ClassVar[Dialect]
    package: ClassVar[Package]
    extra_packages: ClassVar[tuple[Package, ...]] = ()
    """Packages of the same ecosystem installed beside it (programs it would otherwise download at run time)."""
    context_tokens: ClassVar[int]
    """About how many tokens of context its first request takes (its system prompt and tool schemas)."""
    log_paths: ClassVar[tuple[str, ...]] = ()
    memory_mb: ClassVar[int | None] = None
    """The address space (RLIMIT_AS) its processes need, when more than the sandbox's (a runtime reserving
    much more than it uses); the sandbox's limit is raised to it."""
    model: ClassVar[str | None] = None
    """The model name it is told to ask for (None: the served name), unless the instance's session names one."""
    accept_any_model: ClassVar[bool] = False
    """Whether its session answers every model name (a harness making side calls under names of its own)."""

    def env(self, run: HarnessRun) -> dict[str, str]:
        """Variables set for the harness's process (besides HOME and the gateway's own)."""
        return {}

    def files(self, run: HarnessRun) -> dict[str, str]:
        """Config files to write before it starts: absolute path in the sandbox -> text."""
        return {}

    def binds(self, directory: Path) -> tuple[str, ...]:
        """Host directories its install (`directory`) needs at the same path in the sandbox, read-only: for a
        PyPI package, the prefix of the Python its virtual environment was made from (`pyvenv.cfg`'s home)."""
        config = directory / "pyvenv.cfg"
        if self.package.ecosystem != "pypi" or not config.is_file():
            return ()
        for line in config.read_text().splitlines():
            key, _, value = line.partition("=")
            if key.strip() == "home":
                return (str(Path(value.strip()).resolve().parent),)
        return ()

    @abstractmethod
    def command(self, run: HarnessRun) -> str:
        """The bash command that runs the harness on `run.task` in `run.workdir` and exits when it is done."""

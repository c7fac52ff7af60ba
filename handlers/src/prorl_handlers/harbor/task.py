"""A Harbor task folder: finding it under the tasks directory, and reading its task.toml and instruction.

The folder holds `task.toml`, `instruction.md`, `environment/Dockerfile` (its build context is `environment/`),
`tests/test.sh` and, for the oracle, `solution/solve.sh`. task.toml is checked against Harbor's schema
(versions 1.0 and 1.1: `version` or `schema_version`, `[task]`, free-form `[metadata]`, `[verifier]`,
`[agent]`, `[environment]`, `[solution]`): an unknown field, a value of the wrong type, and a field whose
value this server cannot honour (GPUs, MCP servers, artifacts, host variables in `env`) are errors naming
the file and the field.
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, model_validator

from prorl_handlers.errors import BundledHandlerError

NAME_PART = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")  # no "", ".", ".." and no hidden names
MAX_NAME_CHARS = 256
SIZE = re.compile(r"(?P<number>\d+(?:\.\d+)?)\s*(?P<unit>[KMGT])I?B?", re.IGNORECASE)
UNIT_MB = {"K": 1 / 1024, "M": 1, "G": 1024, "T": 1024 * 1024}
REQUIRED = ("task.toml", "instruction.md", "environment/Dockerfile", "tests/test.sh")
SOLUTION = "solution/solve.sh"


class TaskError(BundledHandlerError, ValueError):
    """A task folder that cannot be used; the message names the file (and the field or line)."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Author(_Strict):
    name: str
    email: str | None = None


class PackageInfo(_Strict):
    """`[task]`: the task's name in Harbor's registry."""

    name: str
    description: str = ""
    authors: list[Author] = Field(default_factory=list)
    keywords: list[str] = Field(default_factory=list)


def _literal_env(env: dict[str, str]) -> dict[str, str]:
    """Harbor resolves `${VAR}` from the host's environment; a sandbox gets no host variables."""
    for name, value in env.items():
        if "${" in value:
            raise ValueError(f"{name}: host variables (${{...}}) are not passed into sandboxes; give the value")
    return env


Env = Annotated[dict[str, str], AfterValidator(_literal_env)]


class VerifierConfig(_Strict):
    """`[verifier]`: tests/test.sh's time budget and environment."""

    timeout_sec: float = Field(default=600.0, gt=0)
    env: Env = Field(default_factory=dict)


class AgentConfig(_Strict):
    """`[agent]`: the agent's time budget."""

    timeout_sec: float = Field(default=600.0, gt=0)


class SolutionConfig(_Strict):
    """`[solution]`: solution/solve.sh's environment."""

    env: Env = Field(default_factory=dict)


class EnvironmentConfig(_Strict):
    """`[environment]`: the image and the sandbox's resources. `memory` and `storage` (`"2G"`, `"512M"`) are
    Harbor's older spellings of `memory_mb` and `storage_mb`. `docker_image` (a prebuilt image) is accepted
    and not used: the image is built from environment/Dockerfile. `allow_internet` is accepted; sandboxes
    have no network either way."""

    build_timeout_sec: float = Field(default=600.0, gt=0)
    docker_image: str | None = None
    cpus: int = Field(default=1, ge=1)
    memory_mb: int = Field(default=2048, gt=0)
    storage_mb: int = Field(default=10240, gt=0)
    memory: str | None = None
    storage: str | None = None
    gpus: int = Field(default=0, ge=0, le=0, description="No GPUs for sandboxes here: only 0.")
    gpu_types: list[str] | None = None
    allow_internet: bool = True
    mcp_servers: list[dict[str, Any]] = Field(default_factory=list, max_length=0, description="Not supported.")
    env: Env = Field(default_factory=dict)

    @model_validator(mode="after")
    def _sizes(self) -> EnvironmentConfig:
        """`memory` and `storage` into `memory_mb` and `storage_mb`."""
        for old, new in (("memory", "memory_mb"), ("storage", "storage_mb")):
            text = getattr(self, old)
            if text is None:
                continue
            if new in self.model_fields_set:
                raise ValueError(f"give {new} or {old}, not both")
            match = SIZE.fullmatch(text.strip())
            if match is None or float(match["number"]) <= 0:
                raise ValueError(f"{old} = {text!r} is not a size such as '2G' or '512M'")
            setattr(self, new, max(1, int(float(match["number"]) * UNIT_MB[match["unit"].upper()])))
        return self


class TaskConfig(_Strict):
    """task.toml."""

    schema_version: str = Field(default="1.0", alias="version")
    task: PackageInfo | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)
    source: str | None = None
    artifacts: list[str] = Field(default_factory=list, max_length=0, description="Not supported.")
    verifier: VerifierConfig = Field(default_factory=VerifierConfig)
    agent: AgentConfig = Field(default_factory=AgentConfig)
    environment: EnvironmentConfig = Field(default_factory=EnvironmentConfig)
    solution: SolutionConfig = Field(default_factory=SolutionConfig)

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    @model_validator(mode="before")
    @classmethod
    def _version(cls, data: Any) -> Any:
        """Harbor 1.0 writes `version`, 1.1 `schema_version`."""
        if isinstance(data, dict) and "schema_version" in data:
            if "version" in data:
                raise ValueError("give schema_version or version, not both")
            data = {**data, "version": data["schema_version"]}
            del data["schema_version"]
        return data


@dataclass(frozen=True)
class HarborTask:
    """A task folder that has the files it needs and a valid task.toml."""

    name: str  # as the instance gave it, relative to the tasks directory
    path: Path
    config: TaskConfig
    instruction: str

    @property
    def dockerfile(self) -> Path:
        return self.path / "environment" / "Dockerfile"

    @property
    def tests(self) -> Path:
        return self.path / "tests"

    @property
    def solution(self) -> Path:
        return self.path / "solution"


def task_path(tasks_dir: Path, name: str) -> Path:
    """The folder of task `name` under `tasks_dir`: relative, each part a plain name, and (links resolved)
    inside `tasks_dir`; never another host path."""
    parts = name.split("/")
    if len(name) > MAX_NAME_CHARS or not all(NAME_PART.fullmatch(part) for part in parts):
        raise TaskError(
            f"task {name[:MAX_NAME_CHARS]!r} is not a task name: relative to the tasks directory, '/'-separated "
            "parts of letters, digits, '_', '.' and '-', none starting with '.' or '-'"
        )
    root = tasks_dir.resolve()
    path = (root / name).resolve()
    if not path.is_relative_to(root) or path == root:
        raise TaskError(f"task {name!r} leads outside the tasks directory")
    if not path.is_dir():
        raise TaskError(f"no task {name!r} in the tasks directory (no folder {root / name})")
    return path


def fingerprint(path: Path) -> tuple[tuple[int, int] | None, ...]:
    """Size and modification time of each file a task's reading depends on (None: missing)."""
    stamps = []
    for name in (*REQUIRED, SOLUTION):
        try:
            info = (path / name).stat()
        except OSError:
            stamps.append(None)
        else:
            stamps.append((info.st_size, info.st_mtime_ns))
    return tuple(stamps)


def load_task(tasks_dir: Path, name: str, *, oracle: bool = False) -> HarborTask:
    """Read and check task `name`; with `oracle`, it must have solution/solve.sh too."""
    path = task_path(tasks_dir, name)
    for required in (*REQUIRED, *((SOLUTION,) if oracle else ())):
        if not (path / required).is_file():
            raise TaskError(f"task {name!r}: {path / required} is missing (a Harbor task folder has {required})")
    config_file = path / "task.toml"
    try:
        data = tomllib.loads(config_file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise TaskError(f"{config_file}: {exc}") from exc
    try:
        config = TaskConfig.model_validate(data)
    except ValidationError as exc:
        raise TaskError(f"{config_file}: {_describe(exc)}") from None
    try:
        instruction = (path / "instruction.md").read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise TaskError(f"{path / 'instruction.md'}: {exc}") from exc
    if not instruction.strip():
        raise TaskError(f"{path / 'instruction.md'} is empty")
    return HarborTask(name, path, config, instruction)


def _describe(exc: ValidationError, limit: int = 5) -> str:
    """The first `limit` errors as `field.path: message` (field names as in task.toml)."""
    parts = []
    for error in exc.errors()[:limit]:
        where = ".".join(str(p) for p in error["loc"]) or "(top level)"
        message = "unknown field" if error["type"] == "extra_forbidden" else error["msg"]
        if error["type"] == "too_long":
            message = "not supported here: leave it empty"
        elif error["type"] == "less_than_equal" and where == "environment.gpus":
            message = "this server gives sandboxes no GPUs (gpus must be 0)"
        parts.append(f"{where}: {message}")
    more = len(exc.errors()) - limit
    return "; ".join(parts) + (f" (and {more} more)" if more > 0 else "")

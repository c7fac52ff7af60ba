"""SandboxSpec: what a sandbox should look like, independent of the runtime that makes it."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class Bind(BaseModel):
    """A host path made visible inside the sandbox."""

    model_config = ConfigDict(extra="forbid")

    source: str
    target: str
    read_only: bool = True


class SandboxLimits(BaseModel):
    """Resource limits; `None` means the runtime's default (documented per runtime in docs/sandboxes.md)."""

    model_config = ConfigDict(extra="forbid")

    cpus: float | None = Field(default=None, gt=0, description="CPU cores (cgroup quota where available).")
    cpu_seconds: int | None = Field(default=None, gt=0, description="CPU time per process (RLIMIT_CPU).")
    memory_mb: int | None = Field(default=2048, gt=0, description="Address space per process (RLIMIT_AS).")
    pids: int | None = Field(default=256, gt=0, description="Processes and threads in the sandbox.")
    disk_mb: int | None = Field(default=1024, gt=0, description="Size of the writable workspace and /tmp.")
    file_size_mb: int | None = Field(default=512, gt=0, description="Largest file a process may write.")
    wall_clock_s: float | None = Field(default=None, gt=0, description="Sandbox lifetime; killed after it.")


class SandboxSpec(BaseModel):
    """How to start one sandbox."""

    model_config = ConfigDict(extra="forbid")

    image: str | None = Field(
        default=None,
        description="apptainer: a .sif file or directory image; bubblewrap: a root directory (None = host root, "
        "read-only); podman: an image in podman's local storage or a root directory; local: ignored.",
    )
    binds: list[Bind] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict, description="Added to a scrubbed environment.")
    network: Literal["none", "loopback", "host"] = "none"
    workdir: str = Field(default="/workspace", description="Writable working directory inside the sandbox.")
    fakeroot: bool = Field(default=False, description="apptainer --fakeroot; bubblewrap maps the user to uid 0.")
    limits: SandboxLimits = Field(default_factory=SandboxLimits)
    tools: bool = Field(default=True, description="Start the execution server (bash, IPython, editor) inside.")
    cpu_grants: Literal["per_action", "static"] = Field(
        default="per_action",
        description="With the action scheduler: 'per_action' grants the sandbox cores while an action (a tool "
        "call, its start) runs and an idle share between them; 'static' keeps limits.cpus for its whole life, "
        "outside the pool (for a process inside whose work the server cannot see, such as an agent harness). "
        "Without the action scheduler every sandbox is static.",
    )
    allow_api: bool = Field(
        default=False,
        description="With network host or loopback: may connect to the rollout server's own API port "
        "(denied by default, with Landlock).",
    )
    allow_llm_backends: bool = Field(
        default=False,
        description="With network host or loopback: may connect to the LLM backends' ports (denied by default).",
    )

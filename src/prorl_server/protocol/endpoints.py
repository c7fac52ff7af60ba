"""The endpoints file a deployment writes (deploy/slurm/) and trainers read: where the rollout servers are.

Written atomically once every rollout server answers and has its backends, so a reader never sees half a
file; `read_endpoints(path)` loads it, and `RolloutClient.from_endpoints(path)` connects to its servers.
"""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

ENDPOINTS_VERSION = 1


class Announcement(BaseModel):
    """One process of a deployment that answers its health check: a rollout server or an LLM backend."""

    model_config = ConfigDict(extra="forbid")

    role: Literal["server", "backend"]
    address: str = Field(description="Rollout server base URL, or backend `/v1` base URL.")
    host: str = Field(description="The node it runs on.")
    pid: int = Field(description="Its process id on that node.")
    job_id: str | None = Field(default=None, description="The Slurm job it runs in.")


class Endpoints(BaseModel):
    """The endpoints file: the rollout servers a trainer connects to, and which backends each one got."""

    model_config = ConfigDict(extra="forbid")

    version: Literal[1] = ENDPOINTS_VERSION
    servers: list[str] = Field(min_length=1, description="Rollout server base URLs.")
    backends: list[str] = Field(description="Every LLM backend's `/v1` base URL.")
    assignment: dict[str, list[str]] = Field(description="Server -> the backends registered with it.")
    job_ids: dict[str, str] = Field(default_factory=dict, description='Slurm job ids: {"servers", "backends"}.')
    api_key_required: bool = Field(
        description="Whether the servers want an API key (`Authorization: Bearer`): `$PRORL_API_KEY` when the "
        "service was launched with it, else the key in the user's key file (`prorl_server.auth_key`)."
    )
    written_at: datetime


def read_endpoints(path: str | Path) -> Endpoints:
    """Load and validate an endpoints file."""
    return Endpoints.model_validate_json(Path(path).read_bytes())


def write_atomically(path: Path, text: str) -> None:
    """Write `text` to `path` through a temporary file in the same directory, so readers never see half of it."""
    temporary = path.with_name(f".{path.name}.tmp")
    temporary.write_text(text)
    temporary.replace(path)

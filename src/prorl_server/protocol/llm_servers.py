"""LLM backend registration schemas."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator


class AddLLMServerRequest(BaseModel):
    """Body of `POST /add_llm_server`."""

    model_config = ConfigDict(extra="forbid")

    address: str = Field(description="OpenAI-compatible base URL, e.g. http://host:8000/v1")
    weight_version: str | int | None = None
    tags: dict[str, Any] = Field(default_factory=dict)

    @field_validator("address")
    @classmethod
    def _http_url(cls, value: str) -> str:
        value = value.strip().rstrip("/")
        if not value.startswith(("http://", "https://")):
            raise ValueError("address must be an http(s) URL such as http://host:8000/v1")
        return value


class LLMServerInfo(BaseModel):
    """One registered backend as `GET /llm_servers` shows it."""

    address: str
    weight_version: str | int | None = None
    tags: dict[str, Any] = Field(default_factory=dict)
    model: str | None = None
    assigned: int = Field(description="Jobs ever assigned to this backend since registration.")
    in_flight: int = Field(description="Jobs currently pinned to this backend.")
    healthy: bool
    last_error: str | None = None


class LLMServerList(BaseModel):
    """Answer of `GET /llm_servers`."""

    policy: str
    servers: list[LLMServerInfo]

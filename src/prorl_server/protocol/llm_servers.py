"""LLM backend registration schemas."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from prorl_server.protocol.bounded import TagsJson

WeightVersion = Annotated[str, Field(max_length=256)] | Annotated[int, Field(ge=-(2**63), lt=2**63)]
"""A backend's weight version: a short string or a 64-bit integer (it is repeated in every turn record)."""


def _http_url(value: str) -> str:
    value = value.strip().rstrip("/")
    if not value.startswith(("http://", "https://")):
        raise ValueError("address must be an http(s) URL such as http://host:8000/v1")
    return value


BackendAddress = Annotated[
    str,
    Field(max_length=2048, description="OpenAI-compatible base URL, e.g. http://host:8000/v1"),
    AfterValidator(_http_url),
]
"""A backend's base URL: http(s), without a trailing slash."""


class AddLLMServerRequest(BaseModel):
    """Body of `POST /add_llm_server`; `tags` are free-form JSON within `bounded.TAGS_JSON_LIMITS`."""

    model_config = ConfigDict(extra="forbid")

    address: BackendAddress
    weight_version: WeightVersion | None = None
    tags: TagsJson = Field(default_factory=dict)


class RemoveLLMServerRequest(BaseModel):
    """Body of `POST /remove_llm_server`: drain one backend."""

    model_config = ConfigDict(extra="forbid")

    address: BackendAddress
    abort: bool = Field(
        default=False,
        description="Close its calls in flight now (the engine aborts them; they are sent again on another "
        "backend) instead of letting them finish.",
    )
    timeout_s: float | None = Field(
        default=None,
        gt=0,
        le=86400,
        allow_inf_nan=False,
        description="Answer after this many seconds even if calls are still in flight on it (drained: false).",
    )


class LLMServerInfo(BaseModel):
    """One registered backend as `GET /llm_servers` shows it."""

    address: str
    weight_version: str | int | None = None
    tags: dict[str, Any] = Field(default_factory=dict)
    model: str | None = None
    assigned: int = Field(description="Jobs ever assigned to this backend since registration.")
    in_flight: int = Field(description="Jobs currently pinned to this backend.")
    migrations: int = Field(
        default=0, description="Jobs moved onto this backend at a tool-call boundary (placement presorted_dp)."
    )
    healthy: bool = Field(description="Its last health check (GET /health) passed, or none has run yet.")
    last_error: str | None = None
    circuit: Literal["closed", "open", "half_open"] = Field(
        default="closed",
        description="closed: takes requests; open: out of placement after failed requests; "
        "half_open: one trial request at a time after a passing health check.",
    )
    consecutive_failures: int = Field(default=0, description="Failed requests since the last success.")
    tokens_per_s: float | None = Field(
        default=None, description="Measured output speed (moving average), which sets its stall timeout."
    )
    tokenization: Literal["local", "backend"] | None = Field(
        default=None,
        description="local: its chats are tokenized in the server with its model's tokenizer; backend: by its "
        "/tokenize; null until decided (at its first passing health check or call).",
    )


class LLMServerList(BaseModel):
    """Answer of `GET /llm_servers`."""

    policy: str
    servers: list[LLMServerInfo]


class RemoveLLMServerResponse(BaseModel):
    """Answer of `POST /remove_llm_server`."""

    removed: LLMServerInfo = Field(description="The backend as it was when removed.")
    moved_jobs: int = Field(description="Jobs pinned to it; each moves to another backend at its next call.")
    aborted_calls: int = Field(description="Calls in flight on it that were aborted (abort: true) to be resent.")
    in_flight_calls: int = Field(description="Calls still in flight on it when this answered.")
    drained: bool = Field(description="No call is in flight on it any more: the engine may be stopped.")
    remaining: int = Field(description="Backends still registered.")

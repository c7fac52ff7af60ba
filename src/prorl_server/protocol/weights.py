"""Weight-update schemas: pause dispatching, set the new version (and backends), roll it back, resume."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from prorl_server.protocol.bounded import TagsJson
from prorl_server.protocol.llm_servers import BackendAddress, LLMServerInfo, WeightVersion

PauseMode = Literal["wait", "abort", "keep"]

MAX_SERVERS = 4096


class WeightServer(BaseModel):
    """One backend serving the new weights."""

    model_config = ConfigDict(extra="forbid")

    address: BackendAddress
    tags: TagsJson | None = Field(default=None, description="New tags; a kept backend keeps its tags without.")


class PauseRequest(BaseModel):
    """Body of `POST /weights/pause` (an empty body or `{}` means "wait")."""

    model_config = ConfigDict(extra="forbid")

    mode: PauseMode = Field(
        default="wait",
        description="wait: calls in flight finish; abort: calls in flight are closed now and resent after resume; "
        "keep: the engines freeze the calls in flight (with their KV cache) and go on with them after the resume, "
        "under the new weights (409 naming the engines that cannot).",
    )
    timeout_s: float | None = Field(
        default=None,
        gt=0,
        le=86400,
        allow_inf_nan=False,
        description="Answer after this many seconds even if calls are still in flight (drained: false).",
    )
    lease_s: float | None = Field(
        default=None,
        gt=0,
        le=7 * 86400,
        allow_inf_nan=False,
        description="The pause ends by itself after this many seconds without an update or a resume (default: the "
        "server's --weight-pause-lease), so a trainer that dies mid-update never leaves the server paused.",
    )


class WeightReload(BaseModel):
    """Load new weights into every engine from a checkpoint directory (vLLM with `VLLM_SERVER_DEV_MODE=1`)."""

    model_config = ConfigDict(extra="forbid")

    path: str = Field(
        min_length=1,
        max_length=4096,
        description="The checkpoint directory as the engines see it (safetensors of the served architecture).",
    )
    timeout_s: float = Field(
        default=600.0,
        gt=0,
        le=86400,
        allow_inf_nan=False,
        description="Give up on an engine whose reload has not answered within this many seconds (502).",
    )


class UpdateRequest(BaseModel):
    """Body of `POST /weights/update`."""

    model_config = ConfigDict(extra="forbid")

    version: WeightVersion = Field(
        description="The new weight version: an integer greater than every earlier one, or a string never used."
    )
    servers: list[WeightServer] | None = Field(
        default=None,
        min_length=1,
        max_length=MAX_SERVERS,
        description="Replace the registered backends by these (all at `version`); default: keep them.",
    )
    reload: WeightReload | None = Field(
        default=None,
        description="Before setting the version, each backend (of `servers`, if given) reloads its weights from "
        "this checkpoint and resets its prefix cache; one that fails makes the answer 502 (version unchanged).",
    )


class SwapRequest(UpdateRequest):
    """Body of `POST /weights/swap`: pause, update and resume in one call."""

    mode: PauseMode = "wait"
    timeout_s: float | None = Field(
        default=None,
        gt=0,
        le=86400,
        allow_inf_nan=False,
        description="Give up (409, still not paused) if calls in flight are not done within this many seconds.",
    )


class WeightsStatus(BaseModel):
    """Answer of `GET /weights`."""

    paused: bool
    mode: PauseMode | None = Field(default=None, description="The current pause's mode; null while dispatching.")
    version: str | int | None = Field(
        default=None, description="The version last set by /weights/update or /weights/swap (null before)."
    )
    in_flight_calls: int = Field(description="LLM calls dispatched and not finished (kept ones left out).")
    kept_calls: int = Field(default=0, description="LLM calls a keep pause froze on their engines, resumed after it.")
    waiting_calls: int = Field(description="LLM calls held back by the pause.")
    lease_left_s: float | None = Field(
        default=None,
        description="Seconds until the pause ends by itself unless updated or resumed; null while dispatching.",
    )
    lease_expired: int = Field(default=0, description="Pauses that ended by their lease since the server started.")


class PauseResponse(WeightsStatus):
    """Answer of `POST /weights/pause`."""

    waited_for: int = Field(description="Calls in flight this pause let finish.")
    aborted: int = Field(description="Calls in flight this pause aborted (resent after resume).")
    kept: int = Field(default=0, description="Calls in flight this pause froze on their engines (mode keep).")
    drained: bool = Field(description="No call is in flight (kept ones aside): the engines may be updated.")


class UpdateResponse(WeightsStatus):
    """Answer of `POST /weights/update`."""

    servers: list[LLMServerInfo]


class RollbackResponse(WeightsStatus):
    """Answer of `POST /weights/rollback`: `version` is the one before the update, again."""

    rolled_back_from: WeightVersion = Field(description="The version the undone update had set (it may be set again).")
    restored: list[str] = Field(description="The backends that loaded their previous checkpoint back.")
    servers: list[LLMServerInfo] = Field(description="The backends, as they were before the update.")


class SwapResponse(UpdateResponse):
    """Answer of `POST /weights/swap`."""

    waited_for: int
    aborted: int
    kept: int = 0

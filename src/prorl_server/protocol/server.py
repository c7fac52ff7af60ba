"""Lifecycle, status and discovery schemas."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from prorl_server.protocol.bounded import JobId

MAX_ACK_IDS = 1_000_000
API_KEY_ENV = "PRORL_API_KEY"  # the API key, for the server and the clients that send it


class CancelRequest(BaseModel):
    """Body of `POST /cancel`."""

    model_config = ConfigDict(extra="forbid")

    job_id: JobId


class AckRequest(BaseModel):
    """Body of `POST /jobs/ack`: drop stored results by id and/or everything up to a cursor."""

    model_config = ConfigDict(extra="forbid")

    job_ids: list[JobId] = Field(default_factory=list, max_length=MAX_ACK_IDS, fail_fast=True)
    through: int | None = Field(default=None, ge=0, description="Acknowledge every result up to this cursor.")


class AckResponse(BaseModel):
    """How many stored results were dropped."""

    acknowledged: int


class CancelResponse(BaseModel):
    """Answer of a cancel: the job's status after the call (cancelling a finished job changes nothing)."""

    job_id: str
    status: str


class LifecycleResponse(BaseModel):
    """Answer of `POST /start` and `POST /stop`."""

    running: bool
    cancelled_jobs: int = 0


class SchedulingStatus(BaseModel):
    """The scheduling policies in use and the LLM calls at the backends' admission gates."""

    dispatch_policy: str
    predictor: str
    placement: str
    max_inflight_per_backend: int | None = Field(description="null: unlimited (no admission gate).")
    vllm_priority: bool = Field(description="Whether calls send the dispatch order as vLLM's `priority` field.")
    waiting_calls: int = Field(description="Completion calls waiting for an admission slot.")
    admitted_calls: int = Field(description="Completion calls holding an admission slot.")


class ActionKindStatus(BaseModel):
    """One action kind's figures since the server started (means: null before the first)."""

    granted: int = Field(description="Actions of the kind granted cores.")
    completed: int = Field(description="Actions that completed (did not raise, were not cancelled).")
    refused: int = Field(description="Actions refused at once: they could never fit the pool.")
    mean_act_s: float | None = Field(description="Mean completion time (queued + run) of the completed actions.")
    mean_queue_s: float | None = Field(description="Mean seconds a granted action queued for its cores.")
    mean_cores: float | None = Field(description="Mean cores granted (DoP).")


class ActionsStatus(BaseModel):
    """The action scheduler's CPU pool, now, and its action kinds."""

    cores: int = Field(description="Cores of the pool.")
    busy_cores: int = Field(description="Cores granted to running actions.")
    running: int = Field(description="Actions holding a grant.")
    waiting: int = Field(description="Actions queued for cores.")
    busy_core_seconds: float = Field(description="Busy cores integrated over time since the server started.")
    kinds: dict[str, ActionKindStatus] = Field(
        description="Per action kind (`start`, `bash`, `ipython`, `edit`, `files`, a handler's own; past 32: `other`)."
    )


class StatusResponse(BaseModel):
    """Answer of `GET /status`: queue depths, busy workers, job counts, scheduling."""

    running: bool
    queues: dict[str, int]
    busy_workers: dict[str, int]
    workers: dict[str, int]
    jobs: dict[str, int] = Field(description="Live jobs per status, plus stored finished results.")
    llm_servers: int
    healthy_llm_servers: int
    scheduling: SchedulingStatus | None = Field(
        default=None, description="The scheduling policies and admission gates (null from servers that predate them)."
    )
    health: str = Field(default="ok", description="`ok`, or `degraded` when `problems` is not empty.")
    problems: list[str] = Field(
        default_factory=list,
        description="What makes the server degraded: a stage's event loop that is down or does not turn, a stage "
        "whose workers are all taken by handler calls that outlived their jobs, jobs past their budget that have "
        "not ended, every LLM backend failing its health checks.",
    )
    stuck_calls: dict[str, int] = Field(
        default_factory=dict,
        description="Per stage, handler calls still running after their job ended (threads blocked in a plain-def "
        "method, tasks that ignored cancellation).",
    )
    loop_restarts: dict[str, int] = Field(
        default_factory=dict, description="Per stage, times its event loop died (in handler code) and was restarted."
    )
    actions: ActionsStatus | None = Field(
        default=None, description="The action scheduler's CPU pool (null with --no-action-scheduler)."
    )


class HealthResponse(BaseModel):
    """Answer of `GET /health`: 200 with status `ok`, or 503 with status `degraded` and its `problems`."""

    status: str
    running: bool
    problems: list[str] = Field(default_factory=list, description="Why the server is degraded (see GET /status).")


class HandlerInfo(BaseModel):
    """One loadable handler."""

    data_source: str
    target: str
    loaded: bool
    error: str | None = None

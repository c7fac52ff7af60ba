"""Job submission and result schemas."""

from __future__ import annotations

from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field, JsonValue

from prorl_server.protocol.bounded import JobId, TaskJson


class JobStatus(StrEnum):
    """Where a job is. The last four are terminal."""

    QUEUED = "queued"
    INIT = "init"
    RUN = "run"
    EVAL = "eval"
    COMPLETED = "completed"
    FAILED = "failed"
    TIMEOUT = "timeout"
    CANCELLED = "cancelled"


TERMINAL_STATUSES = frozenset({JobStatus.COMPLETED, JobStatus.FAILED, JobStatus.TIMEOUT, JobStatus.CANCELLED})


class ProcessRequest(BaseModel):
    """Body of `POST /process` and `POST /jobs`.

    `sampling_params` go to vLLM untouched, except the agent keys listed in
    `prorl_server.handlers.AGENT_CONFIG_KEYS` (for example `max_turns`), which go to the handler
    as `ctx.agent_config`. `agent_config` may also be given explicitly; it wins over those keys.
    The three objects are free-form JSON within `bounded.TASK_JSON_LIMITS`.
    """

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    instance: TaskJson = Field(description="The task instance; must contain `data_source`.")
    sampling_params: TaskJson = Field(default_factory=dict)
    agent_config: TaskJson = Field(default_factory=dict)
    job_id: JobId | None = None
    timeout: float | None = Field(
        default=None, gt=0, le=30 * 24 * 3600, description="Seconds of stage time (queues excluded)."
    )


class TurnRecord(BaseModel):
    """One assistant turn, recorded at generation time."""

    backend: str
    weight_version: str | int | None = None
    finish_reason: str | None = None
    prompt_len: int = Field(description="Length of the prompt (token ids) this turn was generated from.")
    output_ids: list[int]
    logprobs: list[float]
    text: str = ""


class Trajectory(BaseModel):
    """Trainer-ready token stream: prompt, then model and observation tokens interleaved."""

    prompt_ids: list[int] = Field(default_factory=list)
    response_ids: list[int] = Field(default_factory=list)
    response_mask: list[int] = Field(default_factory=list, description="1 = model token, 0 = observation")
    response_logprobs: list[float] = Field(default_factory=list, description="0.0 on observation tokens")
    turns: list[TurnRecord] = Field(default_factory=list)
    messages: list[dict[str, JsonValue]] = Field(default_factory=list)


class ErrorInfo(BaseModel):
    """Why a job did not complete: the stage, the exception type and a message."""

    stage: str
    type: str
    message: str


class StageTiming(BaseModel):
    """Seconds spent queued and inside each stage."""

    queue_s: float = 0.0
    init_s: float = 0.0
    run_s: float = 0.0
    eval_s: float = 0.0
    total_s: float = 0.0


class JobResult(BaseModel):
    """The terminal result of a job."""

    job_id: str
    status: JobStatus
    reward: float | None = None
    trajectory: Trajectory = Field(default_factory=Trajectory)
    eval: dict[str, JsonValue] = Field(default_factory=dict)
    artifacts: dict[str, JsonValue] = Field(default_factory=dict)
    error: ErrorInfo | None = None
    timing: StageTiming = Field(default_factory=StageTiming)
    data_source: str | None = None


class JobAccepted(BaseModel):
    """Answer of `POST /jobs`."""

    job_id: str


class JobStatusResponse(BaseModel):
    """Answer of `GET /jobs/{job_id}`; `result` is null until the job is terminal."""

    job_id: str
    status: JobStatus
    result: JobResult | None = None


class JobList(BaseModel):
    """A page of finished results in completion order; pass `next_cursor` as `after` for the next page."""

    results: list[JobResult]
    next_cursor: int

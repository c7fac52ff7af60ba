"""Job submission and result schemas."""

from __future__ import annotations

from enum import StrEnum
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, JsonValue, computed_field

from prorl_server.protocol.bounded import JobId, TaskJson
from prorl_server.protocol.error_kinds import ErrorKind
from prorl_server.protocol.stages import ErrorStage, Stage


class JobStatus(StrEnum):
    """Where a job is. The last five are terminal.

    `stale`: the job was about to sample a turn under weights more than its `max_staleness` versions newer
    than its oldest turn's, with `stale_policy` "end"; its partial trajectory is kept (like a timeout's)."""

    QUEUED = "queued"
    INIT = "init"
    RUN = "run"
    EVAL = "eval"
    COMPLETED = "completed"
    FAILED = "failed"
    TIMEOUT = "timeout"
    CANCELLED = "cancelled"
    STALE = "stale"


TERMINAL_STATUSES = frozenset(
    {JobStatus.COMPLETED, JobStatus.FAILED, JobStatus.TIMEOUT, JobStatus.CANCELLED, JobStatus.STALE}
)

StalePolicy = Literal["end", "continue"]
"""What a job too far behind the current weights does at its next LLM call: end as `stale`, or go on."""


class ProcessRequest(BaseModel):
    """Body of `POST /process` and `POST /jobs`.

    `sampling_params` go to vLLM untouched, except the agent keys listed in
    `prorl_server.handlers.AGENT_CONFIG_KEYS` (for example `max_turns`), which go to the handler
    as `ctx.agent_config`. `agent_config` may also be given explicitly; it wins over those keys.
    The three objects are free-form JSON within `bounded.TASK_JSON_LIMITS`.

    Bounded staleness (per job; null = the server's `--max-staleness` and `--stale-policy`): before each
    sampled turn, the job's oldest turn's weight version is compared with the version the turn would be
    sampled under; more than `max_staleness` versions apart (integers: their difference; otherwise their
    distance in the order versions were set), the job ends with status `stale` under `stale_policy` "end",
    or goes on under the new weights with "continue" (partial rollout). 0 is strictly on-policy.
    """

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    instance: TaskJson = Field(description="The task instance; must contain `data_source`.")
    sampling_params: TaskJson = Field(default_factory=dict)
    agent_config: TaskJson = Field(default_factory=dict)
    job_id: JobId | None = None
    timeout: float | None = Field(
        default=None, gt=0, le=30 * 24 * 3600, description="Seconds of stage time (queues excluded)."
    )
    max_staleness: int | None = Field(
        default=None,
        ge=0,
        lt=2**63,
        strict=True,
        description="Weight versions a job may fall behind before its next turn (default: the server's).",
    )
    stale_policy: StalePolicy | None = Field(
        default=None, description='"end" (status stale) or "continue" past max_staleness (default: the server\'s).'
    )
    requeue_on_restart: bool = Field(
        default=False,
        description="With a journal (--journal): if the server dies while this job is in flight, run it again "
        "after the restart instead of failing it with error type ServerRestarted.",
    )


class WeightSpan(BaseModel):
    """Output tokens `[start, end)` of a turn were sampled under weight version `version`."""

    version: str | int
    start: int = Field(ge=0)
    end: int = Field(ge=0)


class TurnRecord(BaseModel):
    """One assistant turn, recorded at generation time."""

    backend: str
    weight_version: str | int | None = Field(
        default=None, description="The weight version the turn's request was sent under (of its first token)."
    )
    resumed_under: list[str | int] = Field(
        default_factory=list,
        description="Weight versions set while a keep pause held this turn's request frozen on its engine, in "
        "order: the tokens sampled after the resume are of the last one. Empty for a turn of one version.",
    )
    weight_spans: list[WeightSpan] | None = Field(
        default=None,
        description="For a turn with `resumed_under`: which output tokens each version sampled, as the engine "
        "reported it (the dev engine and the simulator do; vLLM 0.32's /v1/completions does not: null then).",
    )
    finish_reason: str | None = None
    stop_sequence: str | None = Field(
        default=None, description="The stop string (of the `stop` sampling param) the turn ended on, if one."
    )
    prompt_len: int = Field(description="Length of the prompt (token ids) this turn was generated from.")
    output_ids: list[int]
    logprobs: list[float]
    text: str = ""
    llm_s: float = Field(
        default=0.0,
        description="Seconds the turn's completion call took at backends (failovers included; its admission "
        "wait and weight-update pauses left out).",
    )
    queue_s: float = Field(
        default=0.0, description="Seconds the call waited for a backend's admission slot (--max-inflight-per-backend)."
    )


class Trajectory(BaseModel):
    """Trainer-ready token stream: prompt, then model and observation tokens interleaved."""

    prompt_ids: list[int] = Field(default_factory=list)
    response_ids: list[int] = Field(default_factory=list)
    response_mask: list[int] = Field(default_factory=list, description="1 = model token, 0 = observation")
    response_logprobs: list[float] = Field(default_factory=list, description="0.0 on observation tokens")
    turns: list[TurnRecord] = Field(default_factory=list)
    messages: list[dict[str, JsonValue]] = Field(default_factory=list)

    @computed_field  # type: ignore[prop-decorator]
    @property
    def weight_versions(self) -> list[str | int]:
        """Every weight version the turns were sampled under, in turn order, each once (None left out); a turn
        kept across a weight update adds the versions it was resumed under."""
        seen: list[str | int] = []
        for turn in self.turns:
            for version in (turn.weight_version, *turn.resumed_under):
                if version is not None and not any(type(v) is type(version) and v == version for v in seen):
                    seen.append(version)
        return seen


class ErrorInfo(BaseModel):
    """Why a job did not complete: the stage, the exception type and a message; for an exception, also
    where it was raised (`location`) and the end of its traceback.

    The server writes `stage` and `type` as enum members (str enums: on the wire each is its value); a
    handler's exception gives `type` its class name, and a hook of the handler's may return any string."""

    stage: Stage | ErrorStage | str = Field(
        description="Where the job failed: `init`, `run`, `eval`, else `final_result`, `result` or `restart`."
    )
    type: ErrorKind | str = Field(
        description="Why: the class name of the exception the job failed on, or one of the server's own kinds "
        "(`Timeout`, `Cancelled`, `ServerStopped`, `ServerRestarted`, `StaleRollout`, ...)."
    )
    message: str
    location: str | None = Field(
        default=None,
        description="`path/to/file.py:123 in func`: the innermost frame of handler code (outside prorl_server "
        "and the standard library) in the exception's traceback, else its innermost frame; null when the "
        "job did not end on an exception (timeout, cancel, stale).",
    )
    traceback: str | None = Field(
        default=None,
        description="The exception's last few frames and its message, at most 2000 characters (the end is "
        "kept); null when the job did not end on an exception.",
    )


class StageTiming(BaseModel):
    """Seconds spent queued, inside each stage, and held by weight-update pauses; then the trajectory's
    telemetry: turns, and the LLM, admission-queue and tool time within its stages."""

    queue_s: float = 0.0
    init_s: float = 0.0
    run_s: float = 0.0
    eval_s: float = 0.0
    weight_pause_s: float = Field(
        default=0.0,
        description="Seconds a stage's LLM calls waited at a weight-update pause; not counted in the stage's "
        "time nor in the job's timeout.",
    )
    total_s: float = 0.0
    turns: int = Field(default=0, description="Completion calls answered (sampled turns).")
    llm_s: float = Field(default=0.0, description="Seconds of completion calls at backends, over all turns.")
    llm_queue_s: float = Field(
        default=0.0, description="Seconds completion calls waited for a backend's admission slot, over all turns."
    )
    tool_s: float = Field(
        default=0.0,
        description="Seconds between a turn's answer and the next completion call: the handler's and tools' time.",
    )


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

"""Server configuration: one pydantic model; the CLI maps its flags onto it."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field


class ServerSettings(BaseModel):
    """Everything `prorl-server serve` can be told."""

    host: str = "127.0.0.1"
    port: int = Field(default=8000, ge=0, le=65535)
    init_workers: int = Field(default=8, ge=1, description="Concurrent INIT stages (sandbox starts).")
    run_workers: int = Field(default=64, ge=1, description="Concurrent RUN stages (agent loops).")
    eval_workers: int = Field(default=8, ge=1, description="Concurrent EVAL stages (scoring).")
    max_ready_for_run: int | None = Field(
        default=None,
        ge=1,
        description="Jobs past the start of INIT still waiting for a RUN worker, at most (default: run_workers). "
        "INIT waits beyond it, so sandboxes never pile up in front of RUN.",
    )
    runtime: Literal["auto", "apptainer", "bwrap", "local"] = Field(
        default="auto",
        description="Sandbox runtime; auto = apptainer when installed and --image is given, else bubblewrap, "
        "else local (no isolation, loudly).",
    )
    sandbox_image: str | None = Field(default=None, description="Default image of ctx.start_sandbox().")
    llm_servers: list[str] = Field(default_factory=list, description="Backends registered at start.")
    handlers: list[str] = Field(default_factory=list, description="Extra handlers, [name=]module:Class.")
    entry_point_handlers: bool = Field(default=True, description="Load the prorl_server.handlers group.")
    placement: Literal["sticky_least_loaded", "min_heap"] = "sticky_least_loaded"
    default_timeout_s: float | None = Field(default=3600.0, gt=0, description="Per-job stage-time budget.")
    result_retention_s: float = Field(default=3600.0, gt=0, description="How long unacknowledged results stay.")
    health_check_interval_s: float = Field(default=10.0, gt=0)
    llm_request_timeout_s: float = Field(default=3600.0, gt=0)
    llm_max_failovers: int = Field(default=3, ge=0, description="Backends a call may move to when one dies.")
    llm_retry_budget_s: float = Field(
        default=120.0,
        ge=0,
        description="Seconds one LLM call keeps retrying, with backoff, while its backends fail or none is "
        "available (the job's own budget also bounds it).",
    )
    llm_failure_threshold: int = Field(
        default=3, ge=1, description="Consecutive failed requests that take a backend out of placement."
    )
    llm_breaker_cooldown_s: float = Field(
        default=5.0, gt=0, description="Seconds before a backend taken out of placement gets a trial request."
    )
    llm_stall_timeout_s: float | None = Field(
        default=None,
        gt=0,
        description="Seconds without a response after which an LLM request counts as stalled and fails over "
        "(default: derived from max_tokens and the backend's measured speed).",
    )
    max_staleness: int | None = Field(
        default=None,
        ge=0,
        description="Weight versions a job's oldest turn may be behind the weights its next turn would be "
        "sampled under (default: unbounded; 0 = strictly on-policy). A job's own `max_staleness` wins.",
    )
    stale_policy: Literal["end", "continue"] = Field(
        default="end",
        description="Past max_staleness: end the job with status stale (partial trajectory kept), or continue "
        "under the new weights (partial rollout). A job's own `stale_policy` wins.",
    )
    cancel_grace_s: float = Field(default=5.0, ge=0, description="Time a cancelled stage gets to unwind.")
    autostart: bool = Field(default=True, description="Start the pools at launch (else wait for POST /start).")
    api_key: str | None = Field(
        default=None,
        min_length=1,
        description="Bearer token every endpoint but /health requires (also $PRORL_API_KEY).",
        repr=False,
    )
    max_body_bytes: int = Field(
        default=32 * 1024 * 1024, ge=1024, description="Largest request body accepted; larger ones get 413."
    )
    log_level: str = "info"

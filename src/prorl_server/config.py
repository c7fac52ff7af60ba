"""Server configuration: one pydantic model, the single source of the `serve` flags (settings_cli.py).

Every field needs a `description`: it is the flag's --help text. The names a setting chooses among are
declared here once; the sandbox registry and the placement policies are keyed by the same names.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal, get_args

from pydantic import BaseModel, Field, field_validator, model_validator

from prorl_server.actions import parse_model_service, parse_service_quota
from prorl_server.protocol import StalePolicy
from prorl_server.scheduling import DEFAULT_PROFILE

RuntimeName = Literal["auto", "apptainer", "bwrap", "local", "podman"]
"""Sandbox runtimes by name (`auto`: the first available of apptainer, bwrap, local, in this order; podman
only when named)."""
RUNTIME_NAMES: tuple[str, ...] = get_args(RuntimeName)

PlacementName = Literal["sticky_least_loaded", "min_heap", "least_loaded", "presorted_dp"]
"""Placement policies by name (llm/placement.py)."""

DispatchPolicyName = Literal["fcfs", "round_robin", "progressive", "srpt"]
"""Orders of the LLM calls waiting for an admission slot (scheduling/dispatch.py)."""

PredictorName = Literal["online", "source_mean", "none"]
"""Length predictors by name (scheduling.PREDICTORS)."""

JournalSync = Literal["normal", "full"]
"""SQLite `synchronous` modes of the results journal (journal/database.py says what each survives)."""

ToolCallFormatName = Literal["auto", "hermes", "qwen3_coder", "llama3_json", "mistral", "deepseek_v3", "gpt_oss"]
"""Tool-call formats by name (tool_call_formats/; `auto`: detected per backend from its chat template)."""

LogLevel = Literal["debug", "info", "warning", "error"]
"""Log levels of `serve` (of its logging and of uvicorn)."""


class ServerSettings(BaseModel):
    """Everything `prorl-server serve` can be told."""

    @field_validator("service_quotas")
    @classmethod
    def _service_quotas_parse(cls, value: list[str]) -> list[str]:
        names = [parse_service_quota(text)[0] for text in value]
        if "judge" in names:
            raise ValueError("--service-quota judge=...: the judge's quota is --judge-max-concurrency and --judge-rate")
        twice = sorted({name for name in names if names.count(name) > 1})
        if twice:
            raise ValueError(f"--service-quota gives {', '.join(twice)} more than once")
        return value

    @field_validator("model_services")
    @classmethod
    def _model_services_parse(cls, value: list[str]) -> list[str]:
        names = [parse_model_service(text)[0] for text in value]
        twice = sorted({name for name in names if names.count(name) > 1})
        if twice:
            raise ValueError(f"--model-service gives {', '.join(twice)} more than once")
        return value

    @model_validator(mode="after")
    def _model_services_fit(self) -> ServerSettings:
        for text in self.model_services:
            name, memory_mb = parse_model_service(text)
            if memory_mb > self.model_service_budget_mb:
                raise ValueError(
                    f"model service {name!r} needs {memory_mb} MiB and --model-service-budget-mb is "
                    f"{self.model_service_budget_mb} MiB"
                )
        return self

    host: str = Field(
        default="127.0.0.1", description="Address to bind (with --no-api-key, anything but loopback logs a warning)."
    )
    port: int = Field(default=8000, ge=0, le=65535, description="Port to bind (0: any free port).")
    init_workers: int = Field(default=8, ge=1, description="Concurrent INIT stages (sandbox starts).")
    run_workers: int = Field(default=64, ge=1, description="Concurrent RUN stages (agent loops).")
    eval_workers: int = Field(default=8, ge=1, description="Concurrent EVAL stages (scoring).")
    max_ready_for_run: int | None = Field(
        default=None,
        ge=1,
        description="Jobs past the start of INIT still waiting for a RUN worker, at most (default: run_workers). "
        "INIT waits beyond it, so sandboxes never pile up in front of RUN.",
    )
    runtime: RuntimeName = Field(
        default="auto",
        description="Sandbox runtime; auto = apptainer when installed and an image is given, else bubblewrap, "
        "else local (no isolation, loudly); podman only when named.",
    )
    sandbox_image: str | None = Field(
        default=None,
        description="Default image of ctx.start_sandbox(): a .sif or directory for Apptainer, a root directory "
        "for bubblewrap, a local image or a root directory for Podman.",
    )
    sandbox_dir: Path = Field(
        default=Path("/tmp"),
        description="Where sandboxes keep their host-side files (sockets, overlays; the local runtime's "
        "workspaces): in DIR/prorl-sandboxes-<uid>/, private to the server's user. On a cluster, the node's "
        "local scratch.",
    )
    action_scheduler: bool = Field(
        default=True,
        description="Grant sandbox tool actions (bash, IPython, editor, files) CPU cores per action from one pool "
        "of this node's cores: a sandbox's cgroup CPU quota (and cpuset) is raised to its grant while an action "
        "runs and lowered to --action-idle-cpus after; actions queue when the pool is busy. Off: every sandbox "
        "keeps the static quota of its limits (docs/sandboxes.md, 'CPU per action').",
    )
    action_cpu_reserve: int | None = Field(
        default=None,
        ge=0,
        description="Cores (the lowest-numbered this process may use) kept out of the action pool for the server "
        "itself (default: one per 16 usable cores, none below 16).",
    )
    action_cpus: str | None = Field(
        default=None,
        description="The CPU ids of the action pool, as a list such as 2-7,10 (default: the CPUs this process may "
        "use but the reserve). Servers sharing a node take disjoint lists (deploy/slurm does).",
    )
    action_idle_cpus: float = Field(
        default=0.1,
        gt=0,
        description="Cores a sandbox's processes share while none of its actions runs (its CPU quota between "
        "actions), so what a task left running in the background goes on, slowly.",
    )
    llm_servers: list[str] = Field(
        default_factory=list,
        description="vLLM OpenAI-compatible base URLs registered at start (repeatable), e.g. http://h:8000/v1.",
    )
    judge_servers: list[str] = Field(
        default_factory=list,
        description="OpenAI-compatible chat base URLs of the LLM judge EVAL reaches as ctx.judge (repeatable), "
        "e.g. http://h:8001/v1; kept apart from the policy's backends. Its API key comes from $PRORL_JUDGE_API_KEY.",
    )
    judge_model: str | None = Field(
        default=None,
        description="Model name of the judge's requests (default: the one model each judge server lists at /models).",
    )
    judge_timeout_s: float = Field(default=120.0, gt=0, description="Seconds one judge request may take.")
    judge_retry_budget_s: float = Field(
        default=60.0,
        ge=0,
        description="Seconds one judge call keeps retrying, with backoff, on the next judge server after a "
        "connection error, 5xx, 429 or timeout (time queued for a slot not counted).",
    )
    judge_max_concurrency: int = Field(
        default=32,
        ge=1,
        description="Judge requests in flight at most, over all judge servers; more queue. While the judge "
        "answers 429 or 503 or times out, the limit is halved (once per wave of requests) and grows back by one "
        "per window of successes.",
    )
    judge_rate: float | None = Field(
        default=None,
        gt=0,
        description="Judge requests started per second at most, in bursts of up to one second's worth "
        "(default: unlimited); e.g. a hosted API's requests-per-minute quota / 60.",
    )
    service_quotas: list[str] = Field(
        default_factory=list,
        description="A quota for an external service handlers call through ctx.service(NAME): "
        "NAME=MAX_CONCURRENCY[/RATE_PER_S], e.g. search=8/20 (repeatable). A service not listed gets 32 in flight "
        "and no rate limit; the judge's is set by --judge-max-concurrency and --judge-rate.",
    )
    model_services: list[str] = Field(
        default_factory=list,
        description="A model service (a judge or a reward model) handlers call through ctx.model_service(NAME): "
        "NAME=MEMORY_MB (repeatable), served on this node's CPU by the dev engine with the bundled SmolLM2-135M "
        "(extra devllm) under the model name NAME, started on first use, and stopped (least recently used and "
        "idle first) when another would not fit in --model-service-budget-mb.",
    )
    model_service_budget_mb: int = Field(
        default=1024,
        ge=1,
        description="MiB the model services' processes may hold at once (their declared MEMORY_MB).",
    )
    handlers: list[str] = Field(
        default_factory=list,
        description="Extra handlers, [name=]module:Class or path/to/file.py:Class (repeatable).",
    )
    entry_point_handlers: bool = Field(
        default=True, description="Load the handler plugins installed under the prorl_server.handlers group."
    )
    placement: PlacementName = Field(
        default="sticky_least_loaded",
        description="Which backend a job's calls go to: a new job pinned to the fewest jobs in flight "
        "(sticky_least_loaded) or the fewest jobs ever assigned (min_heap, ProRL's); every call to the fewest "
        "calls in flight, not sticky (least_loaded); or Heddle's presorted DP over the predicted lengths at a "
        "job's first completion, sticky, with migration at tool-call boundaries (presorted_dp).",
    )
    dispatch_policy: DispatchPolicyName = Field(
        default="fcfs",
        description="Order of the LLM calls waiting for a backend's admission slot: trajectories in arrival order "
        "(fcfs), each turn to the back (round_robin), longest predicted remaining first (progressive, Heddle's), "
        "or shortest first (srpt).",
    )
    predictor: PredictorName = Field(
        default="online",
        description="Length predictor of the progressive and srpt dispatch policies; it learns from every "
        "completed job.",
    )
    interference_profile: str = Field(
        default=DEFAULT_PROFILE,
        description="Per-token seconds by batch size, batch:seconds,... (interpolated), or the path of a profile "
        "file from `prorl-server profile-backend`, that presorted_dp weighs groups with (checked at start). The "
        "default is the LLM simulator's assumed profile, not a measurement of your backends.",
    )
    backend_profiles: list[str] = Field(
        default_factory=list,
        description="A backend's own profile, ADDRESS=PROFILE (a profile file or batch:seconds,...; repeatable), "
        "for heterogeneous backends (e.g. different model-parallel degrees): presorted_dp then sends the "
        "longest predicted trajectories to the lowest-latency backends. Backends without one use "
        "--interference-profile.",
    )
    migration_prefill_s_per_token: float = Field(
        default=1e-4,
        ge=0,
        description="Seconds per context token presorted_dp charges a migration for recomputing the prefix on "
        "the new backend (a move must save more).",
    )
    max_inflight_per_backend: int | None = Field(
        default=None,
        ge=1,
        description="LLM completions in flight per backend, at most; more wait in the dispatch policy's order "
        "(default: unlimited, no waiting).",
    )
    vllm_priority: bool = Field(
        default=False,
        description="Send the dispatch policy's order as vLLM's `priority` request field (lower = sooner; not "
        "with fcfs). Needs vLLM started with --scheduling-policy priority: vLLM refuses a non-zero priority "
        "otherwise.",
    )
    default_timeout_s: float | None = Field(
        default=3600.0, gt=0, description="Per-job budget in seconds of stage time (queue time is not counted)."
    )
    result_retention_s: float = Field(
        default=3600.0, gt=0, description="Seconds an unacknowledged finished result stays retrievable."
    )
    journal: str | None = Field(
        default=None,
        description="SQLite file of the results journal (created if missing; on a local disk, one server per "
        "file): jobs and finished results are written to it, and a server restarted on it after a crash serves "
        "the unacknowledged results again. Default: no journal, results live in memory only.",
    )
    journal_sync: JournalSync = Field(
        default="normal",
        description="normal: a commit survives the server process being killed, not a power loss or OS crash; "
        "full: also those, at one fsync per batch of writes.",
    )
    journal_compact_interval_s: float = Field(
        default=300.0,
        gt=0,
        description="Seconds between compactions of the journal: results past --result-retention deleted, free "
        "pages given back to the file system.",
    )
    health_check_interval_s: float = Field(default=10.0, gt=0, description="Seconds between backend health checks.")
    llm_request_timeout_s: float = Field(default=3600.0, gt=0, description="Seconds one LLM request may take.")
    tokenizer: str | None = Field(
        default=None,
        description="Model directory (tokenizer.json, and tokenizer_config.json or chat_template.jinja) of the "
        "backends' tokenizer and chat template: chats are tokenized in the server with it when it gives the ids "
        "of each backend's /tokenize. Default: the model directory a backend reports as its root, else the "
        "Hugging Face cache's copy of its model (named by its root, else by its served name), else the "
        "backend's /tokenize.",
    )
    tool_call_format: ToolCallFormatName = Field(
        default="auto",
        description="How the models write tool calls: the gateway parses replies and renders past calls in "
        "it, the shared agent loop asks for it. auto: the family of the chat template of each backend's tokenizer "
        "when the server tokenizes its chats (see --tokenizer), else hermes.",
    )
    llm_max_failovers: int = Field(
        default=3,
        ge=0,
        description="Failed requests one LLM call may retry after (on another backend when there is one).",
    )
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
        default=5.0,
        gt=0,
        description="Seconds before a backend taken out of placement gets a trial request (doubled after each "
        "failed trial).",
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
    stale_policy: StalePolicy = Field(
        default="end",
        description="Past max_staleness: end the job with status stale (partial trajectory kept), or continue "
        "under the new weights (partial rollout). A job's own `stale_policy` wins.",
    )
    cancel_grace_s: float = Field(default=5.0, ge=0, description="Seconds a cancelled stage gets to unwind.")
    group_refill_attempts: int = Field(
        default=2,
        ge=0,
        description="Times one group member that failed for an infrastructure reason (its sandbox could not "
        "start, its LLM backends failed past failover, the server restarted) is launched again (0: never).",
    )
    group_max_refills: int = Field(
        default=16,
        ge=0,
        le=1024,  # member indexes stay below 2048, so `{group_id}:{index}` fits a job id
        description="Refills one group may launch in all, whatever its size (at most 1024).",
    )
    weight_pause_lease_s: float = Field(
        default=600.0,
        gt=0,
        le=7 * 86400,
        description="Seconds a weight-update pause lasts without an update or a resume before dispatching resumes "
        "by itself (a pause's own lease_s wins): a trainer that dies mid-update never leaves the server paused.",
    )
    autostart: bool = Field(default=True, description="Start the pools at launch (else wait for POST /start).")
    api_key: str | None = Field(
        default=None,
        min_length=1,
        description="Bearer token every endpoint but /health and the dashboard's static page requires (prefer "
        "$PRORL_API_KEY: a flag shows in ps). Without one or --no-api-key, serve uses the key in its user's key "
        "file ($PRORL_API_KEY_FILE, else $XDG_CONFIG_HOME/prorl-server/api_key, ~/.config by default), made "
        "with a random key when missing; clients of that user read it there.",
        repr=False,
    )
    no_api_key: bool = Field(
        default=False,
        description="Serve without an API key: anyone who can reach the port may submit, cancel, register "
        "backends and stop the server (a single-user machine only). An error together with a key.",
    )
    max_body_bytes: int = Field(
        default=32 * 1024 * 1024, ge=1024, description="Largest request body accepted; larger ones get 413."
    )
    log_level: LogLevel = Field(default="info", description="Log level of the server and uvicorn.")
    gateway_max_sessions: int = Field(
        default=1024, ge=1, description="Gateway sessions open at once, at most; POST /sessions beyond gets 429."
    )
    gateway_idle_timeout_s: float = Field(
        default=900.0,
        gt=0,
        description="Seconds a gateway session may go without a call before it is closed (its recording dropped).",
    )
    gateway_max_segments: int = Field(
        default=256, ge=1, description="Segments (of all its chains) one gateway session may record, at most."
    )
    gateway_max_chains: int = Field(
        default=64,
        ge=1,
        description="Chains (a main agent, its sub-agents, side calls) one gateway session may record, at most.",
    )
    gateway_max_messages: int = Field(
        default=4096, ge=1, description="Messages one gateway chat completion may carry, at most."
    )
    gateway_max_body_bytes: int = Field(
        default=8 * 1024 * 1024,
        ge=1024,
        description="Largest gateway chat-completion body; larger ones get 413 (--max-body-bytes applies too).",
    )
    gateway_url: str | None = Field(
        default=None,
        description="This server's base URL as handlers' agents reach it (ctx.gateway_session); default "
        "http://HOST:PORT (loopback for a wildcard host).",
    )

    def gateway_public_url(self) -> str:
        """`gateway_url`, or the address this server binds."""
        if self.gateway_url is not None:
            return self.gateway_url.rstrip("/")
        host = "127.0.0.1" if self.host in ("0.0.0.0", "") else "[::1]" if self.host == "::" else self.host
        return f"http://{host}:{self.port}"

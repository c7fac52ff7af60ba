"""Admission: `Admission.admit` (reached as `Orchestrator.admit`) validates a request, finds the job that
already has it, or creates the job and queues it for its first stage. The routers call it; nothing else admits.

Validation: the instance's handler's `validate_instance` runs on the posted instance (`check_instance`), so a
bad dataset row is refused (400) at once instead of failing after it was queued.

Idempotence: the same request under the same `job_id` is one job, however often it is sent. A trainer (or its
client's retry after a lost answer) may post a job again. The server compares a digest of the request with the
one of the job holding that id, live or finished and still stored: the same request gets that job back (never
a second run); a different one is refused (409).
"""

from __future__ import annotations

import hashlib
import inspect
import json
import logging
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from pydantic import ValidationError

from prorl_server.handlers import (
    AGENT_CONFIG_KEYS,
    HandlerLoadError,
    HandlerRegistry,
    JobContext,
    UnknownDataSource,
    exception_location,
    exception_message,
)
from prorl_server.llm import LLMSession
from prorl_server.pipeline.errors import DuplicateJob, InvalidInstance, NotAccepting
from prorl_server.pipeline.fork import GroupFork
from prorl_server.pipeline.handler_calls import HandlerMethods
from prorl_server.pipeline.job import Job
from prorl_server.pipeline.timer import PausableTimer
from prorl_server.protocol import JobResult, ProcessRequest, Stage, Trajectory

if TYPE_CHECKING:
    from prorl_server.pipeline.orchestrator import Orchestrator

log = logging.getLogger(__name__)

MAX_FIELD_ERRORS = 5
"""Fields named in a refusal at most (a note counts the rest)."""
_FIELD_CHARS = 100
_MESSAGE_CHARS = 300


def check_instance(registry: HandlerRegistry, instance: dict[str, Any]) -> None:
    """Run the instance's handler's `validate_instance`; InvalidInstance (HTTP 400) when it refuses the
    instance (ValueError, pydantic ValidationError) or crashes (anything else, logged as the handler's bug).

    An instance whose `data_source` names no loaded handler is left to `Admission.admit` to refuse."""
    data_source = instance.get("data_source")
    if not isinstance(data_source, str):
        return
    try:
        handler = registry.get(data_source)
    except (UnknownDataSource, HandlerLoadError):
        return
    try:
        outcome = handler.validate_instance(instance)
    except ValidationError as exc:
        raise InvalidInstance(f"instance refused by handler {data_source!r}: {_fields(exc)}") from exc
    except ValueError as exc:
        raise InvalidInstance(f"instance refused by handler {data_source!r}: {_clip(exception_message(exc))}") from exc
    except BaseException as exc:  # SystemExit and the like too: a validator never takes the request down
        location = exception_location(exc)
        log.warning("validate_instance of handler %r crashed (at %s)", data_source, location, exc_info=exc)
        raise InvalidInstance(
            f"the instance validator of handler {data_source!r} crashed: {type(exc).__name__}: "
            f"{_clip(exception_message(exc))} (at {location}); this is a bug in the handler, not necessarily in "
            "the instance"
        ) from exc
    if inspect.isawaitable(outcome):
        if inspect.iscoroutine(outcome):
            outcome.close()  # never awaited: no "coroutine was never awaited" warning
        log.warning("validate_instance of handler %r is async; it must be a plain def", data_source)
        raise InvalidInstance(
            f"the instance validator of handler {data_source!r} is async: validate_instance() must be a plain "
            "def (it runs inline at submission); this is a bug in the handler"
        )


def _fields(exc: ValidationError) -> str:
    errors = exc.errors(include_url=False, include_input=False)
    parts = []
    for error in errors[:MAX_FIELD_ERRORS]:
        loc = ".".join(str(part) for part in error["loc"])
        where = f"field {_clip(loc, _FIELD_CHARS)!r}" if loc else "instance"
        parts.append(f"{where}: {_clip(error['msg'])}")
    if len(errors) > MAX_FIELD_ERRORS:
        parts.append(f"and {len(errors) - MAX_FIELD_ERRORS} more errors")
    return "; ".join(parts)


def _clip(text: str, limit: int = _MESSAGE_CHARS) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def request_digest(request: ProcessRequest) -> str:
    """A digest of everything a request asks for (key order does not matter)."""
    canonical = json.dumps(request.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


class AdmissionLog(Protocol):
    """Where admission reports each admitted job (the results journal)."""

    def admitted(self, job_id: str, digest: str, request: ProcessRequest) -> None:
        """A job was admitted under `job_id`."""


@dataclass(frozen=True)
class FinishedJob:
    """A job that already ran, as a repeated submission sees it: its id and its stored result."""

    result: JobResult

    @property
    def id(self) -> str:
        return self.result.job_id

    async def wait(self) -> JobResult:
        """The result at once (the job is terminal)."""
        return self.result


class Admission:
    """Admits jobs into `pipeline` (the orchestrator, whose collaborators its jobs get)."""

    def __init__(self, pipeline: Orchestrator) -> None:
        self.pipeline = pipeline

    def admit(
        self,
        request: ProcessRequest,
        group_versions: tuple[str | int, ...] = (),
        fork: GroupFork | None = None,
        *,
        validate: bool = True,
    ) -> Job | FinishedJob:
        """Admit a job and queue it for its first stage. Raises a SubmissionError subclass when it cannot.

        `validate`: run the handler's `validate_instance` first (a group checks its instance once for all
        members, a requeued journal job was checked when first posted). The same request sent again under the
        same `job_id` gets the job that has it (live, or finished with its result still stored) instead of a
        second run; a different request under that id is DuplicateJob. `group_versions`: for a group's refill,
        the weight versions its bounded staleness also counts from. `fork`: the group's shared INIT, for a
        member of a group whose handler forks after INIT (fork.py).
        """
        pipeline = self.pipeline
        if validate:
            check_instance(pipeline.registry, request.instance)
        digest = request_digest(request)
        if request.job_id is not None:
            existing = self._same_request(request.job_id, digest)
            if existing is not None:
                return existing
        if not pipeline.running:
            raise NotAccepting("the server is stopped; POST /start to resume accepting jobs")
        data_source = request.instance.get("data_source")
        if not isinstance(data_source, str) or not data_source:
            raise InvalidInstance(
                "instance.data_source is required (a string naming the handler); known data sources: "
                + (", ".join(pipeline.registry.names()) or "none")
            )
        methods = pipeline.handler_methods.get(pipeline.registry.get(data_source))
        registered, healthy = pipeline.backends.counts()
        if registered == 0:
            raise NotAccepting(
                'no LLM backend is registered; POST /add_llm_server {"address": "http://host:port/v1"} '
                "or start the server with --llm-server URL"
            )
        if healthy == 0:  # open circuits alone do not refuse jobs: their calls wait within the retry budget
            raise NotAccepting(
                f"all {registered} LLM backends are unhealthy (they fail their health checks); see GET /llm_servers"
            )
        job = self._make_job(request, methods, digest, group_versions, fork)

        def journal() -> None:  # under the live jobs' lock: before anything can end the job
            if pipeline.journal is not None:
                pipeline.journal.admitted(job.id, digest, request)

        live = pipeline.live.add(job, journal)
        if live is not job:  # admitted meanwhile by a concurrent submission
            if live.request_digest == digest:
                return live
            raise DuplicateJob(_different_request(job.id, "is in flight"))
        pipeline.pools[job.next_stage].put(job)
        return job

    def _same_request(self, job_id: str, digest: str) -> Job | FinishedJob | None:
        """The job already holding `job_id` if it was asked for with the same request; DuplicateJob if it
        was asked for with another; None if no live or stored job has that id."""
        live = self.pipeline.live.get(job_id)
        if live is not None:
            if live.request_digest != digest:
                raise DuplicateJob(_different_request(job_id, "is in flight"))
            return live
        stored = self.pipeline.results.get_with_digest(job_id)
        if stored is None:
            return None
        result, stored_digest = stored
        if stored_digest != digest:
            raise DuplicateJob(
                _different_request(job_id, "already ran and its result is stored")
                + " (or acknowledge that result first: POST /jobs/ack)"
            )
        return FinishedJob(result)

    def _make_job(
        self,
        request: ProcessRequest,
        methods: HandlerMethods,
        digest: str,
        group_versions: tuple[str | int, ...],
        fork: GroupFork | None,
    ) -> Job:
        pipeline, settings = self.pipeline, self.pipeline.settings
        job_id = request.job_id or uuid.uuid4().hex
        agent_keys = AGENT_CONFIG_KEYS | methods.handler.agent_config_keys
        sampling = {k: v for k, v in request.sampling_params.items() if k not in agent_keys}
        agent_config = {k: v for k, v in request.sampling_params.items() if k in agent_keys}
        agent_config.update(request.agent_config)
        trajectory = Trajectory()
        timeout = request.timeout if request.timeout is not None else settings.default_timeout_s
        timer = PausableTimer(timeout)
        session = LLMSession(
            job_id,
            pipeline.backends,
            trajectory,
            sampling,
            max_failovers=settings.llm_max_failovers,
            max_staleness=request.max_staleness if request.max_staleness is not None else settings.max_staleness,
            stale_policy=request.stale_policy or settings.stale_policy,
            pause_clock=timer,
            client=pipeline.backends.client,
            data_source=str(request.instance.get("data_source", "")),
            dispatch=pipeline.dispatch,
            group_versions=group_versions,
        )
        ctx = JobContext(
            job_id=job_id,
            instance=request.instance,
            sampling_params=sampling,
            agent_config=agent_config,
            llm=session,
            trajectory=trajectory,
            _sandboxes=pipeline.sandboxes,
            _judge=pipeline.judge,
            _services=pipeline.services,
            _model_services=pipeline.model_services,
            _gateway=pipeline.gateway,
            tool_call_format=settings.tool_call_format,
        )
        # a handler without an INIT of its own skips that stage's queue and thread hop
        first_stage = Stage.INIT if methods.stage(Stage.INIT).overridden else Stage.RUN
        return Job(job_id, methods, ctx, timer, digest, first_stage, fork)


def _different_request(job_id: str, state: str) -> str:
    return (
        f"job_id {job_id!r} {state} with a different request; the same request sent again gets that job, "
        "a new request needs another id"
    )

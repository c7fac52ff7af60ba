"""The AgentHandler interface task plugins implement."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, ClassVar

from pydantic import BaseModel

from prorl_server.errors import error_kind_of
from prorl_server.handlers.context import JobContext
from prorl_server.handlers.failure import exception_location, exception_message, short_traceback
from prorl_server.protocol import ErrorInfo, ErrorStage, JobResult, Stage

# Keys of `sampling_params` that configure the agent rather than vLLM; they are moved to
# `ctx.agent_config`. A handler adds its own with the class attribute `agent_config_keys`.
AGENT_CONFIG_KEYS = frozenset({"max_turns", "max_context_length", "tool_timeout", "system_prompt"})


class AgentHandler(ABC):
    """A task plugin: how to set up (INIT), act (RUN) and score (EVAL) one instance.

    Each method may be `async def` or a plain `def` (plain ones run in a worker thread; use
    `ctx.wait(coro)` there to call async APIs). One handler object serves all jobs of its
    `data_source` concurrently: keep per-job state in `ctx`, not on `self`.
    """

    name: ClassVar[str] = ""
    agent_config_keys: ClassVar[frozenset[str]] = frozenset()
    instance_model: ClassVar[type[BaseModel] | None] = None
    """A pydantic model every submitted instance must validate against (None: no check)."""
    fork_after_init: ClassVar[bool] = False
    """In a group, run INIT once and start every member from a copy-on-write fork of the sandbox it initialised,
    with a copy of the `ctx.state` and `ctx.artifacts` it left (docs/handlers.md, "Forking after INIT")."""

    def validate_instance(self, instance: dict[str, Any]) -> None:
        """Check an instance when it is submitted; raise ValueError (or a pydantic ValidationError) naming
        the field to refuse it with HTTP 400. Runs inline on the API's event loop: keep it cheap, no I/O.
        Default: validate against `instance_model`, if set. The instance is not changed either way."""
        if self.instance_model is not None:
            self.instance_model.model_validate(instance)

    def init(self, ctx: JobContext) -> Any:
        """Prepare the job: start a sandbox, register its cleanup with `ctx.on_release`. Default: nothing."""
        return None

    @abstractmethod
    def run(self, ctx: JobContext) -> Any:
        """Run the agent loop with `ctx.llm`; fill `ctx.artifacts` with what EVAL needs."""

    @abstractmethod
    def eval(self, ctx: JobContext) -> Any:
        """Score the job: return a float reward, or a dict with a `reward` key and any details."""

    def init_exception(self, ctx: JobContext, exc: BaseException) -> ErrorInfo | None:
        """INIT raised: return the error to fail the job with, or None to go on to RUN."""
        return default_error(Stage.INIT, exc)

    def run_exception(self, ctx: JobContext, exc: BaseException) -> ErrorInfo | None:
        """RUN raised: return the error to fail the job with, or None to go on to EVAL."""
        return default_error(Stage.RUN, exc)

    def eval_exception(self, ctx: JobContext, exc: BaseException) -> ErrorInfo | None:
        """EVAL raised: return the error to fail the job with, or None to complete it with reward 0."""
        return default_error(Stage.EVAL, exc)

    def final_result(self, ctx: JobContext, result: JobResult) -> JobResult:
        """Last look at a completed, failed or timed-out result before it is returned. Default: as is."""
        return result


def default_error(stage: Stage | ErrorStage | str, exc: BaseException) -> ErrorInfo:
    """The error a stage exception becomes unless the handler decides otherwise, with where it was raised."""
    return ErrorInfo(
        stage=stage,
        type=error_kind_of(exc),
        message=exception_message(exc),
        location=exception_location(exc),
        traceback=short_traceback(exc),
    )

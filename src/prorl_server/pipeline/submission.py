"""Idempotent submission: the same request under the same `job_id` is one job, however often it is sent.

A trainer (or its client's retry after a lost answer) may post a job again. The server compares a digest
of the request with the one of the job holding that id, live or finished and still stored: the same
request gets that job back (never a second run); a different one is refused (409).

Before a request is submitted, `check_instance` runs its handler's `validate_instance` on the posted
instance, so a bad dataset row is refused (400) at once instead of failing after it was queued.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import logging
from dataclasses import dataclass
from typing import Any, Protocol

from pydantic import ValidationError

from prorl_server.handlers import HandlerLoadError, HandlerRegistry, UnknownDataSource
from prorl_server.handlers.failure import exception_location, exception_message
from prorl_server.pipeline.errors import InvalidInstance
from prorl_server.protocol import JobResult, ProcessRequest

log = logging.getLogger(__name__)

MAX_FIELD_ERRORS = 5
"""Fields named in a refusal at most (a note counts the rest)."""
_FIELD_CHARS = 100
_MESSAGE_CHARS = 300


def check_instance(registry: HandlerRegistry, instance: dict[str, Any]) -> None:
    """Run the instance's handler's `validate_instance`; InvalidInstance (HTTP 400) when it refuses the
    instance (ValueError, pydantic ValidationError) or crashes (anything else, logged as the handler's bug).

    An instance whose `data_source` names no loaded handler is left to `Orchestrator.submit` to refuse."""
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
    """Where the orchestrator reports each admitted job (the results journal)."""

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

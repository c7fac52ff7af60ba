"""What the ecosystem-environment adapters share: their errors, the checks of what an environment returns,
and running an environment's blocking calls in a thread with a timeout (see docs/environments.md).

Imports no environment library: the adapters import theirs when a job needs it, so the handlers load (and
fail their jobs with a clear message) where the library is not installed.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from prorl_handlers.errors import BundledHandlerError

T = TypeVar("T")

DEFAULT_MAX_TURNS = 8
MAX_TURNS_CAP = 64
DEFAULT_STEP_TIMEOUT_S = 60.0


class EnvAdapterError(BundledHandlerError):
    """An ecosystem environment could not be run: its library is missing, or its instance is unusable."""


class UnknownEnvironment(EnvAdapterError, LookupError):
    """The instance names an environment the library does not know (the message lists the known ones)."""


class EnvironmentFailed(EnvAdapterError):
    """The environment raised, or ran past its timeout, in one of its calls (the message names the env and
    the call: make, init, step N)."""


class MalformedObservation(EnvAdapterError, ValueError):
    """The environment returned something of the wrong shape (not a list of chat messages, a reward that is
    not a finite number, ...)."""


class ChatMessage(BaseModel):
    """A message of a prompt: any chat role, text content (extra keys such as `name` are kept)."""

    model_config = ConfigDict(extra="allow")

    role: Literal["system", "user", "assistant", "tool"]
    content: str


class Observation(ChatMessage):
    """A message an environment answers with: the model's turn is never the environment's to write."""

    role: Literal["user", "tool", "system"]


class StepResult(BaseModel):
    """One step's output, checked: observations, a finite reward, whether the episode is done."""

    observations: list[Observation] = Field(default_factory=list)
    reward: float = 0.0
    done: bool
    metadata: dict[str, Any] | None = None

    @field_validator("reward")
    @classmethod
    def _finite(cls, value: float) -> float:
        if not math.isfinite(value):
            raise ValueError("reward must be a finite number")
        return value


def describe(exc: ValidationError, limit: int = 3) -> str:
    """A pydantic error as `field: message; ...` (at most `limit`), without the offending values."""
    parts = [f"{'.'.join(map(str, e['loc'])) or 'value'}: {e['msg']}" for e in exc.errors()[:limit]]
    return "; ".join(parts)


def check(model: type[BaseModel], value: Any, env: str, call: str) -> Any:
    """`value` validated as `model`, else MalformedObservation naming the env and the call."""
    try:
        return model.model_validate(value)
    except ValidationError as exc:
        raise MalformedObservation(f"environment {env!r} returned a malformed {call} output: {describe(exc)}") from None


def check_messages(value: Any, env: str, call: str, model: type[ChatMessage] = Observation) -> list[dict[str, Any]]:
    """`value` as a list of chat messages (dicts), else MalformedObservation."""
    if not isinstance(value, list):
        raise MalformedObservation(
            f"environment {env!r} returned a malformed {call} output: expected a list of chat messages, "
            f"got {type(value).__name__}"
        )
    try:
        return [model.model_validate(m).model_dump() for m in value]
    except ValidationError as exc:
        raise MalformedObservation(f"environment {env!r} returned a malformed {call} output: {describe(exc)}") from None


async def call_env(env: str, call: str, fn: Callable[..., T], *args: Any, timeout: float) -> T:
    """`fn(*args)` in a thread (an environment's calls may block), at most `timeout` seconds; an exception or
    the timeout becomes EnvironmentFailed naming `env` and `call`. A timed-out thread is left to finish on
    its own (Python cannot stop it); the job goes on failing at once."""
    try:
        return await asyncio.wait_for(asyncio.to_thread(fn, *args), timeout)
    except TimeoutError:
        raise EnvironmentFailed(f"environment {env!r} {call}: no answer within {timeout:g} s") from None
    except EnvAdapterError:
        raise
    except Exception as exc:
        raise EnvironmentFailed(f"environment {env!r} {call} raised {type(exc).__name__}: {exc}") from exc


def known_names(names: Any, limit: int = 20) -> str:
    """`a, b, c` (sorted, at most `limit`, then `...`)."""
    ordered = sorted(map(str, names))
    return ", ".join(ordered[:limit]) + (", ..." if len(ordered) > limit else "")

"""What the scripted test double is told and what it records: scripted replies, prompt scripts, the record
of each request, and the two ways a completion is refused before any reply (no reply queued, context)."""

from __future__ import annotations

import collections
import re
import time
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from prorl_server.errors import TestDoubleError

MODEL_NAME = "scripted-test-double"
MODEL_ROOT = "/scripted/model"  # the checkpoint `GET /v1/models` names as `root` (vLLM: the model it started with)
MAX_MODEL_LEN = 32768  # the context length it advertises and enforces unless told otherwise


class ScriptedReply(BaseModel):
    """One scripted completion: `text` (tokenized, end-of-turn appended when `finish_reason` is "stop") or `ids`.

    A `status_code` other than 200 answers that HTTP error instead (after `delay_s`).
    """

    model_config = ConfigDict(extra="forbid")

    text: str | None = Field(default=None, description="What the model says (ignored when `ids` is given).")
    ids: list[int] | None = Field(default=None, description="The exact token ids to return, as they are.")
    logprobs: list[float] | None = Field(default=None, description="One per id (default: -0.1 .. -0.7 cycling).")
    finish_reason: str = Field(default="stop", description='"stop" (end-of-turn appended to `text`) or "length".')
    stop_reason: str | None = Field(
        default=None,
        description="A stop string the reply ends on, as vLLM reports it (give `ids`: no end-of-turn is sampled); "
        "the text sent ends before it, as vLLM's does.",
    )
    delay_s: float | None = Field(
        default=None, ge=0, description="Seconds to 'generate' (default: the backend's default_delay_s)."
    )
    status_code: int = Field(default=200, description="200, or 400 to 599: answer this HTTP error instead.")

    @field_validator("status_code")
    @classmethod
    def _an_answer_or_an_error(cls, status: int) -> int:
        if status != 200 and not 400 <= status <= 599:
            raise ValueError("status_code is 200 (a completion) or an error status, 400 to 599")
        return status


Reply = ScriptedReply | str
"""A reply as tests write it: a plain string is `ScriptedReply(text=...)`."""


def as_reply(reply: Reply) -> ScriptedReply:
    """`reply` as a ScriptedReply."""
    return ScriptedReply(text=reply) if isinstance(reply, str) else reply


@dataclass
class PromptScript:
    """Replies for completions whose decoded prompt matches: contains `text`, or `regex` finds a match."""

    text: str | None
    regex: re.Pattern[str] | None
    replies: collections.deque[ScriptedReply] = field(default_factory=collections.deque)

    def matches(self, prompt: str) -> bool:
        """Whether this script is for `prompt`."""
        return self.text in prompt if self.regex is None else self.regex.search(prompt) is not None

    def describe(self) -> str:
        """How it matches, e.g. `prompt containing 'x'`."""
        return f"prompt containing {self.text!r}" if self.regex is None else f"prompt matching /{self.regex.pattern}/"


@dataclass
class RequestRecord:
    """What the double saw of one completion request, and which script answered it (`source`)."""

    prompt: list[int]
    params: dict[str, Any]
    job_id: str | None = None  # from the X-Prorl-Job-Id header prorl-server sends
    messages: list[dict[str, Any]] | None = None  # of a chat completion (its `prompt` is their ChatML rendering)
    source: str = ""  # "job 'j'", "prompt containing 'x'", "global queue", "default reply" or "none"
    outcome: str = "running"  # running | done | aborted | faulted (see fault_log) | unscripted
    started: float = field(default_factory=time.monotonic)


class NoReplyQueued(TestDoubleError, LookupError):
    """A completion came in and no script had a reply for it (and there is no default reply)."""


class ContextRefused(TestDoubleError, ValueError):
    """A completion vLLM refuses for its context length; `param` is the field vLLM's error names."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.param = param

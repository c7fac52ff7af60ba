"""`prorl_chat`: the verifiers harness the verifiers handler plays every role with (docs/environments.md).

A tool-less chat loop, like verifiers' own `null` harness, but run in the server's process instead of as a
program in a runtime (verifiers allows it: "the interception is the contract, not the process"). Each segment
sends the conversation so far to verifiers' interception server, which passes it on to the job's gateway
session (so every completion is recorded token-exact) and records the turn in the verifiers trace; one
completion ends the segment. A resumed segment (the environment's next user turn) is checked first: only
text messages of the user, system or tool role may be handed to the model, else the job fails with
MalformedObservation.

Imports verifiers: the handler imports this module only once a job needs it, and gives it to verifiers
under the harness id `prorl_chat` (verifiers imports a harness by a top-level module name).
"""

from __future__ import annotations

from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

import openai
from verifiers.v1.configs.harness import HarnessConfig
from verifiers.v1.dialects.chat import message_to_wire
from verifiers.v1.errors import MODEL_TRANSPORT_ERROR_EXIT_CODE
from verifiers.v1.harness import Harness
from verifiers.v1.runtimes import ProgramResult
from verifiers.v1.types import TextContentPart

from prorl_handlers.env_adapters import EnvAdapterError, MalformedObservation

OBSERVATION_ROLES = ("user", "system", "tool")


@dataclass
class Watch:
    """What the harness tells the handler about the episode running in its context: verifiers records only an
    error's type and text, so the handler takes the adapter's own errors from here."""

    env: str
    failures: list[EnvAdapterError] = field(default_factory=list)


WATCH: ContextVar[Watch | None] = ContextVar("prorl_verifiers_watch", default=None)
"""The episode's Watch: the handler sets one around each episode (verifiers' tasks inherit it)."""


class ChatHarnessConfig(HarnessConfig):
    """No settings of its own."""


class ChatHarness(Harness[ChatHarnessConfig]):
    """One completion per segment, in the server's process; the environment supplies every other message."""

    APPENDS_SYSTEM_PROMPT = True
    SUPPORTS_RESUME = True
    EXECUTES_CODE = False
    NEEDS_CONTAINER = False

    async def resume(self, ctx, trace, runtime, endpoint, secret, mcp_urls, data, messages, tool_interception_url=None):
        """The environment's next turn (`messages`), checked, then the conversation relaunched with it."""
        for index, message in enumerate(messages):
            problem = _not_an_observation(message)
            if problem is not None:
                watch = WATCH.get()
                env = watch.env if watch is not None else trace.task.type
                failure = MalformedObservation(
                    f"environment {env!r} returned a malformed observation after turn {trace.num_turns}: "
                    f"message {index}: {problem}"
                )
                if watch is not None:
                    watch.failures.append(failure)
                raise failure
        return await super().resume(ctx, trace, runtime, endpoint, secret, mcp_urls, data, messages)

    async def launch(self, ctx, trace, runtime, endpoint, secret, mcp_urls, data, tool_interception_url=None):
        """One chat completion of the conversation `data` holds, through the interception at `endpoint`."""
        system, prompt = self.resolve_prompt(data)
        conversation: list[dict[str, Any]] = [{"role": "system", "content": system}] if system else []
        if isinstance(prompt, str):
            conversation.append({"role": "user", "content": prompt})
        elif prompt:
            conversation += [message_to_wire(message) for message in prompt]
        client = openai.AsyncOpenAI(base_url=endpoint, api_key=secret, max_retries=0)
        try:
            completion = await client.chat.completions.create(model=ctx.model, messages=conversation)
        except openai.APIStatusError as exc:  # a refused turn (a limit or a @stop reached, a gateway error)
            return ProgramResult(1, "", str(exc))
        except openai.APIConnectionError as exc:
            return ProgramResult(MODEL_TRANSPORT_ERROR_EXIT_CODE, "", str(exc))
        finally:
            await client.close()
        return ProgramResult(0, completion.choices[0].message.content or "", "")


def _not_an_observation(message: Any) -> str | None:
    """Why `message` cannot be handed to the model as the environment's turn (None: it can)."""
    role = getattr(message, "role", None)
    if role not in OBSERVATION_ROLES:
        return f"role {role!r} (an environment speaks as {', '.join(OBSERVATION_ROLES)})"
    content = getattr(message, "content", None)
    if isinstance(content, str):
        return None
    if isinstance(content, list) and all(isinstance(part, TextContentPart) for part in content):
        return None
    return "content that is not text (the gateway takes text only)"


__all__ = ["ChatHarness"]

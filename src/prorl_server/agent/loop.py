"""The agent loop shared by handlers: generate, parse tool calls, run them in the sandbox, repeat.

Token ids only: the prompt is the chat template of the system prompt (the task's instructions plus the
tool schemas and how to call them, in the job's tool-call format: the loop's `tool_format`, else the
server's `--tool-call-format`, whose `auto` is the family of the job's backend's chat template, Hermes
when it is unknown) and the first user message, or a list of messages (few-shot turns); after that every
turn appends the sampled ids and the template delta of the observations (`LLMSession`), never a
re-tokenization of model output. Turns are sampled with `skip_special_tokens: false` (unless the trainer's
sampling params say otherwise), so that calls written with special tokens reach the parser.

The episode ends when a tool ends it (`stop_reason="submitted"`: the submitting tool, or a tool returning
`ToolResult(done=True)`), after `max_turns` turns ("max_turns"), when the next turn could not fit the
model's context ("context_length": the prompt plus `max_tokens` would exceed the limit, checked before
each turn and before appending observations), or, with `on_no_tool_call="finish"`, at the first turn
without a tool call ("no_tool_call"). The trajectory ends with the model's last turn: the tools of the
last allowed turn still run (their effects count) but their observations are not appended, nor when the
context is already too full for another turn (only observations that fit but leave no room for a turn
end it: their length is known once appended). Malformed calls, unknown tools and bad arguments become error observations the model reads; a
failed sandbox (`SandboxFailure`) or any other exception inside a tool fails the job.

Roles: tool results and the errors of calls are `observation_role` messages ("tool": the chat template
wraps them as tool responses); the loop's own reminder after a turn without a call answers no call, so
it is a `reminder_role` message ("user").

`agent_config` keys (from the request's `sampling_params`): `max_turns` (default: the loop's, 10),
`max_context_length` (else the backend's `max_model_len`), `tool_timeout` (seconds, default 30),
`system_prompt` (replaces the handler's instructions, or is appended to them: `system_prompt_mode`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal

from prorl_server.agent.tool_specs import Tool, ToolArgumentError, ToolResult
from prorl_server.handlers import JobContext
from prorl_server.tool_call_formats import (
    HERMES,
    MalformedCall,
    ToolCall,
    ToolCallFormat,
    backend_format,
    keep_call_markers,
    tool_format,
)

DEFAULT_MAX_TURNS = 10
DEFAULT_TURN_TOKENS = 1024  # max_tokens of a turn when the sampling params do not set it
MIN_TURN_TOKENS = 16  # without max_tokens, fewer free tokens than this end the episode

StopReason = Literal["submitted", "max_turns", "context_length", "no_tool_call"]
SystemPromptMode = Literal["replace", "append"]
Message = dict[str, Any]


def tools_prompt(instructions: str, tools: list[Tool], call_format: ToolCallFormat = HERMES) -> str:
    """The system prompt: the task's instructions, then the tool schemas and how to call them."""
    schemas = "\n".join(json.dumps(t.schema()) for t in tools)
    if call_format is not HERMES:
        return (
            f"{instructions.strip()}\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
            f"You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n{schemas}\n</tools>\n\n"
            f"To call a function, write:\n{call_format.hint}"
        )
    return (
        f"{instructions.strip()}\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
        f"You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n{schemas}\n</tools>\n\n"
        "For each function call, return a json object with function name and arguments within "
        '<tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n'
        "</tool_call>"
    )


@dataclass
class AgentResult:
    """How an episode went."""

    stop_reason: StopReason
    turns: int = 0
    tool_calls: int = 0
    tool_errors: int = 0
    submission: dict[str, Any] | None = None

    def summary(self) -> dict[str, Any]:
        """JSON for `ctx.artifacts["agent"]`."""
        return {
            "stop_reason": self.stop_reason,
            "turns": self.turns,
            "tool_calls": self.tool_calls,
            "tool_errors": self.tool_errors,
            "submitted": self.submission is not None,
        }


@dataclass
class AgentLoop:
    """A tool-using agent: `await AgentLoop(tools, instructions).run(ctx, task)`.

    `system_prompt_mode`: what the trainer's `agent_config["system_prompt"]` does to `instructions`,
    "replace" them (default) or "append" to them; the handler chooses. `observation_role` is the role of
    tool results ("tool": the chat template decides how they look); `reminder_role` the role of the
    loop's own messages ("user"). `no_tool_call_reminder` is what the model reads after a turn without a
    call (`on_no_tool_call="remind"`; by default it shows a call in the job's format). `tool_format` names
    the tool-call format (`prorl_server.tool_call_formats.FORMATS`); by default the server's `--tool-call-format`.
    """

    tools: list[Tool]
    instructions: str
    max_turns: int = DEFAULT_MAX_TURNS
    on_no_tool_call: Literal["remind", "finish"] = "remind"
    system_prompt_mode: SystemPromptMode = "replace"
    observation_role: str = "tool"
    reminder_role: str = "user"
    no_tool_call_reminder: str | None = None
    tool_format: str | None = None

    def __post_init__(self) -> None:
        names = [t.name for t in self.tools]
        if len(set(names)) != len(names):
            raise ValueError(f"tool names must be unique: {names}")
        if self.system_prompt_mode not in ("replace", "append"):
            raise ValueError(f"system_prompt_mode must be 'replace' or 'append', not {self.system_prompt_mode!r}")
        self._by_name = {t.name: t for t in self.tools}
        self._schemas = [t.schema() for t in self.tools]
        if self.tool_format is not None:
            tool_format(self.tool_format)  # an unknown name fails here, not in the first job

    async def call_format(self, ctx: JobContext) -> ToolCallFormat:
        """The job's tool-call format: the loop's own, else the server's; `auto` is the family of the chat
        template of the job's backend (Hermes when it is not known or not recognised)."""
        name = self.tool_format or ctx.tool_call_format
        return backend_format(name, await ctx.llm.chat_template() if name == "auto" else None)

    def system_instructions(self, agent_config: dict[str, Any]) -> str:
        """The instructions of the system prompt (before the tool schemas), given the trainer's
        `agent_config["system_prompt"]` and `system_prompt_mode`."""
        override = agent_config.get("system_prompt")
        if not override:
            return self.instructions
        if self.system_prompt_mode == "append":
            return f"{self.instructions.strip()}\n\n{str(override).strip()}"
        return str(override)

    async def run(self, ctx: JobContext, task: str | list[Message]) -> AgentResult:
        """Run one episode on `ctx.llm` (filling `ctx.trajectory`); records the summary in `ctx.artifacts`.

        `task` is the first user message, or the messages after the system prompt (few-shot examples,
        then the task): no `system` message (the loop writes it), and not ending with an `assistant` one.
        """
        config = ctx.agent_config
        max_turns = int(config.get("max_turns") or self.max_turns)
        call_format = await self.call_format(ctx)
        system = {"role": "system", "content": tools_prompt(self.system_instructions(config), self.tools, call_format)}
        await ctx.llm.start([system, *_conversation(task)])
        limit = config.get("max_context_length") or await ctx.llm.context_limit()
        result = AgentResult(stop_reason="max_turns")
        while result.turns < max_turns:
            overrides = self._turn_budget(ctx, limit)
            if overrides is None:
                result.stop_reason = "context_length"
                break
            turn = await ctx.llm.generate(**{**keep_call_markers(ctx.sampling_params), **overrides})
            result.turns += 1
            observations, stop = await self._act(ctx, call_format, turn.text, result)
            if stop is not None:
                result.stop_reason = stop
                break
            if result.turns == max_turns:  # no turn answers them: the trajectory ends with the model's turn
                break
            if self._turn_budget(ctx, limit) is None:  # full already: the observations would end it
                result.stop_reason = "context_length"
                break
            await ctx.llm.add_messages(observations)
        ctx.artifacts["agent"] = result.summary()
        return result

    def _turn_budget(self, ctx: JobContext, limit: int | None) -> dict[str, Any] | None:
        """Sampling overrides for the next turn, or None when it cannot fit the context."""
        used = ctx.llm.tokens.context_len()  # twice a turn: no copy of the context
        max_tokens = ctx.llm.sampling_params.get("max_tokens")
        if max_tokens is not None:
            return {} if limit is None or used + int(max_tokens) <= limit else None
        if limit is None:
            return {"max_tokens": DEFAULT_TURN_TOKENS}
        room = limit - used
        return {"max_tokens": min(DEFAULT_TURN_TOKENS, room)} if room >= MIN_TURN_TOKENS else None

    async def _act(
        self, ctx: JobContext, call_format: ToolCallFormat, text: str, result: AgentResult
    ) -> tuple[list[Message], StopReason | None]:
        """Run the turn's calls in order; returns the messages the model reads next, or why the episode ends."""
        _, calls = call_format.parse(text, self._schemas)
        if not calls:
            if self.on_no_tool_call == "finish":
                return [], "no_tool_call"
            reminder = self.no_tool_call_reminder or (
                f"No tool call found. Call a tool as {call_format.hint}, or call the submitting tool when you are done."
            )
            return [{"role": self.reminder_role, "content": reminder}], None
        observations = []
        for call in calls:
            result.tool_calls += 1
            observation = await self._call(ctx, call, result)
            if result.submission is not None:
                return observations, "submitted"
            observations.append({"role": self.observation_role, "content": observation})
        return observations, None

    async def _call(self, ctx: JobContext, call: ToolCall | MalformedCall, result: AgentResult) -> str:
        if isinstance(call, MalformedCall):
            result.tool_errors += 1
            return f"Error: {call.message}"
        tool = self._by_name.get(call.name)
        if tool is None:
            result.tool_errors += 1
            return f"Error: there is no tool {call.name!r}; the tools are: {', '.join(self._by_name)}"
        try:
            arguments = tool.check(call.arguments)
        except ToolArgumentError as exc:
            result.tool_errors += 1
            return f"Error: {exc}"
        if tool.ends_episode:
            result.submission = arguments
            return ""
        outcome = await tool.run(ctx, arguments)
        if not isinstance(outcome, ToolResult):
            return outcome
        if outcome.done:
            result.submission = arguments
        return outcome.observation


def _conversation(task: str | list[Message]) -> list[Message]:
    """The messages after the system prompt: the task as one user message, or the given list, checked."""
    if isinstance(task, str):
        return [{"role": "user", "content": task}]
    messages = [dict(m) for m in task]
    if not messages:
        raise ValueError("the task's message list is empty")
    for i, message in enumerate(messages):
        if not isinstance(message.get("role"), str) or "content" not in message:
            raise ValueError(f"message {i} of the task needs a string 'role' and a 'content'")
        if message["role"] == "system":
            raise ValueError(
                f"message {i} of the task is a system message: the loop writes the system prompt "
                "(put instructions in AgentLoop.instructions)"
            )
    if messages[-1]["role"] == "assistant":
        raise ValueError("the task's messages end with an assistant message: the model would answer nothing")
    return messages

"""The agent loop shared by handlers: generate, parse tool calls, run them in the sandbox, repeat.

Token ids only: the prompt is the chat template of the system prompt (the task's instructions plus the
tool schemas in the Hermes format) and the first user message; after that every turn appends the sampled
ids and the template delta of the observations (`LLMSession`), never a re-tokenization of model output.

The episode ends when the model calls the submitting tool (`stop_reason="submitted"`), after `max_turns`
turns ("max_turns"), when the next turn could not fit the model's context ("context_length": the prompt
plus `max_tokens` would exceed the limit, checked before each turn), or, with `on_no_tool_call="finish"`,
at the first turn without a tool call ("no_tool_call"). Malformed calls, unknown tools and bad arguments
become error observations the model reads; an exception inside a tool (the sandbox died) fails the job.

`agent_config` keys (from the request's `sampling_params`): `max_turns`, `max_context_length` (else the
backend's `max_model_len`), `tool_timeout`, `system_prompt` (replaces the handler's instructions).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Literal

from prorl_server.agent.tool_calls import FORMAT_HINT, MalformedCall, ToolCall, parse_tool_calls
from prorl_server.agent.tools import Tool, ToolArgumentError
from prorl_server.handlers.context import JobContext

DEFAULT_MAX_TURNS = 10
DEFAULT_TURN_TOKENS = 1024  # max_tokens of a turn when the sampling params do not set it
MIN_TURN_TOKENS = 16  # without max_tokens, fewer free tokens than this end the episode

StopReason = Literal["submitted", "max_turns", "context_length", "no_tool_call"]


def tools_prompt(instructions: str, tools: list[Tool]) -> str:
    """The system prompt: the task's instructions, then the tool schemas and the call format (Hermes)."""
    schemas = "\n".join(json.dumps(t.schema()) for t in tools)
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
    """A tool-using agent: `await AgentLoop(tools, instructions).run(ctx, task_text)`.

    `observation_role` is the role of tool results ("tool": the chat template decides how they look).
    `no_tool_call_reminder` is what the model reads after a turn without a call (`on_no_tool_call="remind"`).
    """

    tools: list[Tool]
    instructions: str
    max_turns: int = DEFAULT_MAX_TURNS
    on_no_tool_call: Literal["remind", "finish"] = "remind"
    observation_role: str = "tool"
    no_tool_call_reminder: str = field(
        default=f"No tool call found. Call a tool as {FORMAT_HINT}, or call the submitting tool when you are done."
    )

    def __post_init__(self) -> None:
        names = [t.name for t in self.tools]
        if len(set(names)) != len(names):
            raise ValueError(f"tool names must be unique: {names}")
        self._by_name = {t.name: t for t in self.tools}

    async def run(self, ctx: JobContext, task: str) -> AgentResult:
        """Run one episode on `ctx.llm` (filling `ctx.trajectory`); records the summary in `ctx.artifacts`."""
        config = ctx.agent_config
        max_turns = int(config.get("max_turns") or self.max_turns)
        instructions = str(config.get("system_prompt") or self.instructions)
        messages = [
            {"role": "system", "content": tools_prompt(instructions, self.tools)},
            {"role": "user", "content": task},
        ]
        await ctx.llm.start(messages)
        limit = config.get("max_context_length") or await ctx.llm.context_limit()
        result = AgentResult(stop_reason="max_turns")
        for _ in range(max_turns):
            overrides = self._turn_budget(ctx, limit)
            if overrides is None:
                result.stop_reason = "context_length"
                break
            turn = await ctx.llm.generate(**overrides)
            result.turns += 1
            observations, stop = await self._act(ctx, turn.text, result)
            if stop is not None:
                result.stop_reason = stop
                break
            await ctx.llm.add_messages([{"role": self.observation_role, "content": o} for o in observations])
        ctx.artifacts["agent"] = result.summary()
        return result

    def _turn_budget(self, ctx: JobContext, limit: int | None) -> dict[str, Any] | None:
        """Sampling overrides for the next turn, or None when it cannot fit the context."""
        used = len(ctx.llm.token_ids)
        max_tokens = ctx.llm.sampling_params.get("max_tokens")
        if max_tokens is not None:
            return {} if limit is None or used + int(max_tokens) <= limit else None
        if limit is None:
            return {"max_tokens": DEFAULT_TURN_TOKENS}
        room = limit - used
        return {"max_tokens": min(DEFAULT_TURN_TOKENS, room)} if room >= MIN_TURN_TOKENS else None

    async def _act(self, ctx: JobContext, text: str, result: AgentResult) -> tuple[list[str], StopReason | None]:
        """Run the turn's calls in order; returns their observations, or why the episode ends."""
        calls = parse_tool_calls(text)
        if not calls:
            if self.on_no_tool_call == "finish":
                return [], "no_tool_call"
            return [self.no_tool_call_reminder], None
        observations = []
        for call in calls:
            result.tool_calls += 1
            observation = await self._call(ctx, call, result)
            if result.submission is not None:
                return observations, "submitted"
            observations.append(observation)
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
        return await tool.run(ctx, arguments)

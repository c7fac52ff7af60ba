"""Tools an agent can call: a JSON schema the model sees, and what a call does in the job's sandbox.

`Tool.run(ctx, arguments)` returns the observation text the model reads next, or a `ToolResult`: with
`done=True` the call ends the episode (its arguments become the submission), else its `observation` is
what the model reads, so a tool decides at each call whether the episode ends (`submit_tool(check=...)`
lets the model retry a wrong submission). A tool with `ends_episode=True` (a plain `submit_tool()`) runs
nothing: any well-formed call ends the episode. The built-in tools act on `ctx.sandbox` with
`agent_config["tool_timeout"]` (default 30 s); a failed action (`ActionError`: a refused edit, a missing
file) is an observation, a failed sandbox (`SandboxFailure`) propagates and fails the job.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from prorl_server.errors import ProrlError
from prorl_server.handlers import JobContext
from prorl_server.tool_server.errors import ActionError


@dataclass(frozen=True)
class ToolResult:
    """A tool call's outcome when it may end the episode.

    `done=False`: `observation` is what the model reads next (e.g. why a submission is wrong, so it can
    retry). `done=True`: the episode ends after this call with `stop_reason="submitted"`, the call's
    arguments become `AgentResult.submission`, and nothing more is appended (`observation` is not shown).
    """

    observation: str = ""
    done: bool = False


ToolFunction = Callable[[JobContext, dict[str, Any]], Awaitable[str | ToolResult]]
SubmitCheck = Callable[[JobContext, dict[str, Any]], Awaitable[str | None]]

DEFAULT_TOOL_TIMEOUT_S = 30.0
_JSON_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
    "object": (dict,),
    "array": (list,),
}


class ToolArgumentError(ProrlError, ValueError):
    """A call's arguments do not match the tool's schema (the message is the model's observation)."""


@dataclass(frozen=True)
class Tool:
    """A function the model may call: `run(ctx, arguments)` returns the observation (str) or a `ToolResult`;
    `ends_episode=True` ends the episode at any well-formed call without running anything."""

    name: str
    description: str
    parameters: dict[str, Any] = field(default_factory=lambda: {"type": "object", "properties": {}})
    run: ToolFunction | None = None
    ends_episode: bool = False

    def schema(self) -> dict[str, Any]:
        """The OpenAI-style function schema shown to the model."""
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": self.parameters},
        }

    def check(self, arguments: dict[str, Any]) -> dict[str, Any]:
        """The arguments if they fit the schema's required keys, known keys and JSON types."""
        properties: dict[str, Any] = self.parameters.get("properties", {})
        missing = [k for k in self.parameters.get("required", []) if k not in arguments]
        if missing:
            raise ToolArgumentError(f"{self.name} needs the argument(s) {', '.join(missing)}")
        unknown = sorted(set(arguments) - set(properties))
        if unknown:
            takes = f"it takes: {', '.join(properties)}" if properties else "it takes no arguments"
            raise ToolArgumentError(f"{self.name} has no argument(s) {', '.join(unknown)}; {takes}")
        for key, value in arguments.items():
            expected = properties[key].get("type")
            types = _JSON_TYPES.get(expected) if isinstance(expected, str) else None
            if types is not None and (not isinstance(value, types) or (isinstance(value, bool) and bool not in types)):
                raise ToolArgumentError(f"argument {key!r} of {self.name} must be a JSON {expected}")
            allowed = properties[key].get("enum")
            if allowed is not None and value not in allowed:
                raise ToolArgumentError(f"argument {key!r} of {self.name} must be one of {allowed}")
        return arguments


def _object(properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    return {"type": "object", "properties": properties, "required": required}


def tool_timeout(ctx: JobContext) -> float:
    """Seconds one tool call may take (`agent_config["tool_timeout"]`)."""
    return float(ctx.agent_config.get("tool_timeout") or DEFAULT_TOOL_TIMEOUT_S)


def command_text(output: str, exit_code: int | None, timed_out: bool, timeout: float) -> str:
    """A command's observation as the model reads it: output, then how it ended."""
    if timed_out:
        return f"{output.rstrip(chr(10))}\n[timed out after {timeout:g} s]"
    return f"{output.rstrip(chr(10))}\n[exit code: {exit_code}]" if exit_code else output


async def _bash(ctx: JobContext, arguments: dict[str, Any]) -> str:
    timeout = tool_timeout(ctx)
    result = await _sandbox(ctx).bash(arguments["command"], timeout=timeout)
    return command_text(result.output, result.exit_code, result.timed_out, timeout)


async def _ipython(ctx: JobContext, arguments: dict[str, Any]) -> str:
    timeout = tool_timeout(ctx)
    result = await _sandbox(ctx).ipython(arguments["code"], timeout=timeout)
    return command_text(result.output, 0, result.timed_out, timeout)


async def _edit(ctx: JobContext, arguments: dict[str, Any]) -> str:
    options = {k: v for k, v in arguments.items() if k not in ("command", "path")}
    try:
        result = await _sandbox(ctx).edit(arguments["command"], arguments["path"], **options)
    except ActionError as exc:  # the file system refused (read-only, not readable, ...): the model reads why
        return f"Error: {exc.error}: {exc.message}"
    return result.output if result.success else f"Error: {result.output}"


def _sandbox(ctx: JobContext):
    if ctx.sandbox is None:
        raise RuntimeError("this tool needs a sandbox: start one in init with `await ctx.start_sandbox()`")
    return ctx.sandbox


def bash_tool() -> Tool:
    """A persistent bash shell in the job's sandbox (cwd and variables persist between calls)."""
    return Tool(
        "bash",
        "Run a bash command in a persistent shell; the working directory and variables persist between calls.",
        _object({"command": {"type": "string", "description": "the command line to run"}}, ["command"]),
        _bash,
    )


def ipython_tool() -> Tool:
    """A persistent IPython kernel in the job's sandbox (variables persist between calls)."""
    return Tool(
        "ipython",
        "Run Python code in a persistent IPython kernel; variables persist between calls. The value of the "
        "last expression is shown; use print() for anything else.",
        _object({"code": {"type": "string", "description": "Python code to execute"}}, ["code"]),
        _ipython,
    )


def editor_tool() -> Tool:
    """View, create and edit files in the job's sandbox."""
    properties = {
        "command": {"type": "string", "enum": ["view", "create", "str_replace", "insert", "undo_edit"]},
        "path": {"type": "string", "description": "file or directory path"},
        "file_text": {"type": "string", "description": "create: the whole content"},
        "old_str": {"type": "string", "description": "str_replace: the exact text to replace (must be unique)"},
        "new_str": {"type": "string", "description": "str_replace / insert: the new text"},
        "insert_line": {"type": "integer", "description": "insert: the line after which to insert"},
        "view_range": {"type": "array", "description": "view: [first line, last line]"},
    }
    return Tool(
        "str_replace_editor",
        "View a file or directory, create a file, replace a unique string, insert after a line, or undo the "
        "last edit of a file.",
        _object(properties, ["command", "path"]),
        _edit,
    )


def submit_tool(
    name: str = "submit",
    description: str = "Submit your final answer; this ends the episode.",
    parameters: dict[str, Any] | None = None,
    check: SubmitCheck | None = None,
) -> Tool:
    """The tool that ends the episode; its arguments are the submission (e.g. `{"answer": ...}`).

    With `check`, an `async def check(ctx, arguments) -> str | None`, the episode ends only when it returns
    None; a string rejects the submission and is the observation the model reads (it may submit again).
    """
    schema = parameters or _object({}, [])
    if check is None:
        return Tool(name, description, schema, None, ends_episode=True)

    async def run(ctx: JobContext, arguments: dict[str, Any]) -> ToolResult:
        rejection = await check(ctx, arguments)
        return ToolResult(done=True) if rejection is None else ToolResult(rejection)

    return Tool(name, description, schema, run)

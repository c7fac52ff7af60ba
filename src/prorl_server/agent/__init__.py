"""The shared agent loop: tool schemas in the system prompt, Hermes-format tool calls, sandbox tools.

A tool-using handler in a few lines::

    class MyHandler(AgentHandler):
        name = "my_task"
        loop = AgentLoop([bash_tool(), submit_tool(parameters=...)], "You solve ...")

        async def init(self, ctx):
            await ctx.start_sandbox()

        async def run(self, ctx):
            result = await self.loop.run(ctx, ctx.instance["question"])
            ctx.artifacts["answer"] = (result.submission or {}).get("answer")

See docs/handlers.md.
"""

from prorl_server.agent.loop import AgentLoop, AgentResult, tools_prompt
from prorl_server.agent.tool_specs import (
    Tool,
    ToolArgumentError,
    ToolResult,
    bash_tool,
    editor_tool,
    ipython_tool,
    submit_tool,
)
from prorl_server.tool_call_formats import MalformedCall, ToolCall, parse_tool_calls

__all__ = [
    "AgentLoop",
    "AgentResult",
    "MalformedCall",
    "Tool",
    "ToolArgumentError",
    "ToolCall",
    "ToolResult",
    "bash_tool",
    "editor_tool",
    "ipython_tool",
    "parse_tool_calls",
    "submit_tool",
    "tools_prompt",
]

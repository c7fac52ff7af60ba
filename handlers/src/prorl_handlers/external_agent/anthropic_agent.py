"""An example agent for `external_agent`: a tool loop over bash, written with the official `anthropic`
package and nothing of prorl-server, as any harness would be.

    ANTHROPIC_BASE_URL=... ANTHROPIC_API_KEY=... ANTHROPIC_MODEL=... python3 anthropic_agent.py "the task" \
        [--max-steps N] [--max-tokens N]

Each step asks the model for the next message (Anthropic's Messages API, `max_tokens` per message); each of
its `tool_use` blocks of the `bash` tool is run (in the current directory, with a timeout and its output cut
to a few thousand characters) and answered with a `tool_result` block in the next user turn; a message
without tool use is the final answer, whose text is printed on stdout. Each reply is sent back as the SDK
returned it and the conversation only ever grows, so the gateway records it as one segment.
"""

from __future__ import annotations

import argparse
import os
import subprocess
from typing import Any

from anthropic import Anthropic

SYSTEM = (
    "You are an agent in a Linux sandbox. Use the bash tool to inspect and change files and to run commands. "
    "When the task is done, answer with a short final message and no tool call."
)
BASH_TOOL = {
    "name": "bash",
    "description": "Run a bash command in the working directory; returns its exit code and output.",
    "input_schema": {
        "type": "object",
        "properties": {"command": {"type": "string", "description": "The command to run."}},
        "required": ["command"],
    },
}
COMMAND_TIMEOUT_S = 60
MAX_OBSERVATION_CHARS = 4000


def run_bash(command: str) -> str:
    """The command's exit code and (cut) output, as the tool's result."""
    try:
        done = subprocess.run(
            ["bash", "-c", command], capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S, errors="replace"
        )
    except subprocess.TimeoutExpired:
        return f"timed out after {COMMAND_TIMEOUT_S} s"
    output = (done.stdout + done.stderr)[-MAX_OBSERVATION_CHARS:]
    return f"exit code {done.returncode}\n{output}"


def call_tool(name: str, arguments: Any) -> str:
    """Run one tool use; one the agent cannot run is answered with why, for the model to read."""
    if name != "bash" or not isinstance(arguments, dict) or not isinstance(arguments.get("command"), str):
        return "error: the only tool is bash, with a string argument 'command'"
    return run_bash(arguments["command"])


def solve(task: str, max_steps: int, max_tokens: int) -> str:
    """Run the loop until a final answer or `max_steps` model calls; returns the final answer."""
    client = Anthropic()  # ANTHROPIC_BASE_URL and ANTHROPIC_API_KEY from the environment
    model = os.environ.get("ANTHROPIC_MODEL", "policy")
    messages: list[dict] = [{"role": "user", "content": task}]
    for _ in range(max_steps):
        reply = client.messages.create(
            model=model, max_tokens=max_tokens, system=SYSTEM, messages=messages, tools=[BASH_TOOL]
        )
        messages.append({"role": "assistant", "content": reply.content})
        uses = [block for block in reply.content if block.type == "tool_use"]
        if not uses:
            return "".join(block.text for block in reply.content if block.type == "text")
        results = [
            {"type": "tool_result", "tool_use_id": use.id, "content": call_tool(use.name, use.input)} for use in uses
        ]
        messages.append({"role": "user", "content": results})
    return ""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("task")
    parser.add_argument("--max-steps", type=int, default=20)
    parser.add_argument("--max-tokens", type=int, default=1024, help="max_tokens of each message")
    args = parser.parse_args()
    print(solve(args.task, args.max_steps, args.max_tokens))


if __name__ == "__main__":
    main()

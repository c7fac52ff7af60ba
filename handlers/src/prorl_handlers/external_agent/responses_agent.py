"""An example agent for `external_agent`: a tool loop over bash, written with the official `openai`
package's Responses API and nothing of prorl-server, as any harness would be.

    OPENAI_BASE_URL=... OPENAI_API_KEY=... OPENAI_MODEL=... python3 responses_agent.py "the task" \
        [--max-steps N] [--max-tokens N]

Each step asks the model for the next response (`client.responses.create`, with `store=False`); each of its
`function_call` items of the `bash` tool is run (in the current directory, with a timeout and its output cut
to a few thousand characters) and answered with a `function_call_output` item; a response without calls is
the final answer, whose text is printed on stdout. Every request sends the whole conversation as its input
items (the response's output items appended as they came, then the outputs), so it only ever grows and the
gateway records it as one segment.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
from typing import Any

from openai import OpenAI

INSTRUCTIONS = (
    "You are an agent in a Linux sandbox. Use the bash tool to inspect and change files and to run commands. "
    "When the task is done, answer with a short final message and no tool call."
)
BASH_TOOL = {
    "type": "function",
    "name": "bash",
    "description": "Run a bash command in the working directory; returns its exit code and output.",
    "parameters": {
        "type": "object",
        "properties": {"command": {"type": "string", "description": "The command to run."}},
        "required": ["command"],
    },
    "strict": False,
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


def call_tool(name: str, arguments: str) -> str:
    """Run one function call; a call the agent cannot run is answered with why, for the model to read."""
    try:
        args = json.loads(arguments or "{}")
    except ValueError:
        return "error: the arguments are not JSON"
    if name != "bash" or not isinstance(args, dict) or not isinstance(args.get("command"), str):
        return "error: the only tool is bash, with a string argument 'command'"
    return run_bash(args["command"])


def solve(task: str, max_steps: int, max_tokens: int | None) -> str:
    """Run the loop until a final answer or `max_steps` model calls; returns the final answer."""
    client = OpenAI()  # OPENAI_BASE_URL and OPENAI_API_KEY from the environment
    model = os.environ.get("OPENAI_MODEL", "policy")
    limit: dict[str, Any] = {} if max_tokens is None else {"max_output_tokens": max_tokens}
    items: list[dict] = [{"role": "user", "content": task}]
    for _ in range(max_steps):
        response = client.responses.create(
            model=model, instructions=INSTRUCTIONS, input=items, tools=[BASH_TOOL], store=False, **limit
        )
        items += [item.model_dump() for item in response.output]
        calls = [item for item in response.output if item.type == "function_call"]
        if not calls:
            return response.output_text
        items += [
            {"type": "function_call_output", "call_id": call.call_id, "output": call_tool(call.name, call.arguments)}
            for call in calls
        ]
    return ""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("task")
    parser.add_argument("--max-steps", type=int, default=20)
    parser.add_argument("--max-tokens", type=int, help="max_output_tokens of each response (default: the server's)")
    args = parser.parse_args()
    print(solve(args.task, args.max_steps, args.max_tokens))


if __name__ == "__main__":
    main()

"""One task per harness preset for benchmarks/bench_harnesses.py: write 42 to answer.txt with the harness's own
file or shell tool, check it, and finish the harness's own way, as the scripted test double's replies (Hermes
`<tool_call>` blocks in each harness's tool names and argument shapes; Terminus's JSON keystrokes)."""

from __future__ import annotations

import json
from dataclasses import dataclass


def tool_call(text: str, name: str, arguments: dict) -> str:
    """A reply: `text`, then a Hermes-style call of tool `name`."""
    return f"{text}<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


def terminus_reply(analysis: str, keystrokes: list[str], complete: bool = False) -> str:
    """A reply in Terminus-2's JSON format."""
    commands = [{"keystrokes": k, "duration": 0.1} for k in keystrokes]
    return json.dumps({"analysis": analysis, "plan": analysis, "commands": commands, "task_complete": complete})


@dataclass(frozen=True)
class HarnessTask:
    """The replies that drive one harness through the task, in order (each one model call), and those of its
    side calls by a text of their prompts (a side call made at the same time as a main call would otherwise
    take the main call's reply)."""

    harness: str
    replies: tuple[str, ...]
    side_replies: tuple[tuple[str, str], ...] = ()


TASK = "Write 42 to answer.txt and check it."
SCORE = {"command": 'test "$(cat answer.txt)" = 42'}
TASKS = {
    task.harness: task
    for task in (
        HarnessTask(
            "claude_code",
            (
                tool_call("Writing.", "Write", {"file_path": "/workspace/answer.txt", "content": "42\n"}),
                tool_call("Checking.", "Bash", {"command": "cat answer.txt", "description": "Show the answer"}),
                "Done: answer.txt holds 42.",
            ),
        ),
        HarnessTask(
            "codex",
            (
                tool_call("Writing.", "exec_command", {"cmd": "echo 42 > answer.txt"}),
                tool_call("Checking.", "exec_command", {"cmd": "cat answer.txt"}),
                "Done: answer.txt holds 42.",
            ),
        ),
        HarnessTask(
            "opencode",
            (
                tool_call("Writing.", "write", {"filePath": "/workspace/answer.txt", "content": "42\n"}),
                tool_call("Checking.", "bash", {"command": "cat answer.txt"}),
                "Done: answer.txt holds 42.",
            ),
            side_replies=(("You are a title generator", "Answer file"),),
        ),
        HarnessTask(
            "mini_swe_agent",
            (
                tool_call("Writing.", "bash", {"command": "echo 42 > answer.txt"}),
                tool_call("Checking.", "bash", {"command": "cat answer.txt"}),
                tool_call("Done.", "bash", {"command": "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"}),
            ),
        ),
        HarnessTask(
            "terminus",
            (
                terminus_reply("Nothing done yet.", ["echo 42 > answer.txt\n", "cat answer.txt\n"]),
                terminus_reply("answer.txt holds 42.", [], complete=True),
                terminus_reply("Yes, answer.txt holds 42.", [], complete=True),
            ),
        ),
    )
}
"""The task of each preset that has one, by preset name."""

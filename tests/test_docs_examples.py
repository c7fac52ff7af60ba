"""The handler guide's tool-using example, taken from docs/handlers.md and run through a real server with a
bubblewrap sandbox and the scripted test double (which plays the model)."""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest

from prorl_server.sandbox.registry import unavailable_reason

DOCS = Path(__file__).resolve().parents[1] / "docs"
GUIDE = DOCS / "handlers.md"


def section_code(title: str) -> str:
    """The first python block under a `## title` heading of the guide."""
    text = GUIDE.read_text()
    section = text[text.index(f"## {title}") :]
    return re.search(r"```python\n(.*?)```", section, re.DOTALL).group(1)


def call(name: str, **arguments) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


@pytest.mark.skipif(unavailable_reason("bwrap") is not None, reason=f"bwrap: {unavailable_reason('bwrap')}")
@pytest.mark.parametrize(("answer", "reward"), [("5", 1.0), ("4", 0.0)])
def test_the_agent_loop_example_of_the_guide_runs(start_server, backend, answer, reward):
    namespace: dict = {}
    exec(compile(section_code("Tool-using tasks: the shared agent loop"), str(GUIDE), "exec"), namespace)
    handler = namespace["WordCountHandler"]()
    backend.double.push(call("bash", command="wc -w < /workspace/text.txt"), call("submit", answer=answer))
    server = start_server([backend.address], handlers={"wordcount": handler}, runtime="bwrap")
    instance = {"data_source": "wordcount", "text": "one two three four five"}
    result = server.http.post("/process", json={"instance": instance}).json()
    assert result["status"] == "completed" and result["reward"] == reward, result
    tool_messages = [m["content"] for m in result["trajectory"]["messages"] if m["role"] == "tool"]
    assert tool_messages == ["5\n"]


@pytest.mark.skipif(unavailable_reason("bwrap") is not None, reason=f"bwrap: {unavailable_reason('bwrap')}")
async def test_the_sandbox_example_of_the_sandbox_guide_runs(capsys):
    """docs/sandboxes.md's first block, as written (top-level await), against the runtime it picks here."""
    text = (DOCS / "sandboxes.md").read_text()
    code = re.search(r"```python\n(.*?)```", text, re.DOTALL).group(1)
    await eval(compile(code, "docs/sandboxes.md", "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT), {})
    assert "Linux" in capsys.readouterr().out

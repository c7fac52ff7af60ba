"""The handler guide's tool-using example, taken from docs/handlers.md and run through a real server with a
bubblewrap sandbox and the scripted test double (which plays the model)."""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest
from repo_paths import DOCS

from prorl_server.sandbox.registry import unavailable_reason

DOCS = DOCS
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


def test_the_harbor_guides_base_map_maps_the_common_debian_tags_and_the_rest_falls_back(tmp_path):
    """docs/harbor.md's PRORL_HARBOR_BASE_MAP, as written: the shipped tasks' FROM and its usual other tags
    build on the local base; a tag it does not list is a debootstrap, not an error."""
    from prorl_server.imaging import convert

    text = (DOCS / "harbor.md").read_text()
    base = tmp_path / "imgroot"
    base.mkdir()
    listed = re.search(r'export PRORL_HARBOR_BASE_MAP="([^"]*)"', text).group(1).replace("$base", str(base))
    base_map = {name: Path(path) for name, _, path in (item.partition("=") for item in listed.split())}

    def converted(image: str):
        folder = tmp_path / image.replace("/", "_").replace(":", "_")
        folder.mkdir()
        (folder / "Dockerfile").write_text(f"FROM {image}\nWORKDIR /app\n")
        return convert(folder / "Dockerfile", base_map=base_map)

    for image in ("debian:bookworm", "debian:bookworm-slim", "debian:12", "debian:12-slim"):
        assert converted(image).base == base, image
        assert converted(f"docker.io/library/{image}").base == base, image  # Docker Hub's implicit prefix
    dated = converted("debian:bookworm-20250113")
    assert (dated.base, dated.suite) == (None, "bookworm")

"""Every ```python block of docs/handlers.md compiles, and every one not marked as a fragment runs on its own.

A block is a fragment when the line before its fence is `<!-- fragment: why -->` (a signature listing, say);
fragments are only compiled. The handlers the blocks define are run through a real server with the scripted
test double playing the model (here, or in the test named in COVERED_ELSEWHERE); the guide's claims about
`ctx.start_sandbox()`, `ctx.sandbox` and the sandbox's calls are checked against a bubblewrap sandbox.
"""

from __future__ import annotations

import ast
import asyncio
import importlib.util
import inspect
import json
import os
import re
import sys
import tomllib
from dataclasses import dataclass
from fnmatch import fnmatch
from typing import Any

import pytest
from repo_paths import REPO

from prorl_server import AgentHandler, JobContext, JobResult
from prorl_server.sandbox import Bind, SandboxSpec
from prorl_server.sandbox.registry import unavailable_reason

ROOT = REPO
GUIDE = ROOT / "docs" / "handlers.md"
FRAGMENT = re.compile(r"<!--\s*fragment:\s*(\S.*?)\s*-->")
MAX_FRAGMENTS = 3  # keep them few: a reader copies blocks, and only a block that runs is known to work

# Handler classes of the guide whose run through a server is tested elsewhere (the test's file).
COVERED_ELSEWHERE = {
    "CheckedCapitalsHandler": "tests/handlers/test_handler_errors.py",
    "WordCountHandler": "tests/handlers/test_docs_examples.py",
    "JudgedCapitalHandler": "tests/handlers/test_judge.py",
}
# Handler classes of the guide run through a server by a test of this file.
RUN_HERE = {"CapitalsHandler", "SyncCapitalsHandler", "WorkdirHandler", "FunctionHandler"}

bwrap = pytest.mark.skipif(unavailable_reason("bwrap") is not None, reason=f"bwrap: {unavailable_reason('bwrap')}")


@dataclass(frozen=True)
class Block:
    """A fenced code block of the guide."""

    line: int  # of its opening fence, 1-based
    lang: str
    code: str
    fragment: str | None  # why it is a fragment, or None

    def __str__(self) -> str:
        return f"{GUIDE.name}:{self.line}"


def guide_blocks(lang: str = "python") -> list[Block]:
    """The guide's fenced blocks of one language, in order."""
    lines = GUIDE.read_text().splitlines()
    blocks: list[Block] = []
    i = 0
    while i < len(lines):
        fence = re.fullmatch(r"```(\w*)\s*", lines[i])
        if fence is None:
            i += 1
            continue
        end = next((j for j in range(i + 1, len(lines)) if lines[j].strip() == "```"), None)
        assert end is not None, f"{GUIDE.name}:{i + 1}: a code block is never closed"
        if fence.group(1) == lang:
            marker = FRAGMENT.fullmatch(lines[i - 1].strip()) if i else None
            code = "\n".join(lines[i + 1 : end]) + "\n"
            blocks.append(Block(i + 1, lang, code, marker.group(1) if marker else None))
        i = end + 1
    return blocks


PYTHON_BLOCKS = guide_blocks()
RUNNABLE = [b for b in PYTHON_BLOCKS if b.fragment is None]


def compiled(block: Block):
    return compile(block.code, str(block), "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)


def run_block(block: Block) -> dict[str, Any]:
    """Run a block in a fresh namespace (awaiting it if it has a top-level await); returns the namespace."""
    namespace: dict[str, Any] = {"__name__": f"handlers_md_line_{block.line}"}
    code = compiled(block)
    if code.co_flags & inspect.CO_COROUTINE:
        asyncio.run(eval(code, namespace))
    else:
        exec(code, namespace)
    return namespace


def defined_handlers(block: Block, namespace: dict[str, Any]) -> dict[str, type[AgentHandler]]:
    """The concrete AgentHandler classes a block defines."""
    return {
        name: value
        for name, value in namespace.items()
        if isinstance(value, type)
        and issubclass(value, AgentHandler)
        and value.__module__ == namespace["__name__"]
        and not inspect.isabstract(value)
    }


def handler_class(name: str) -> type[AgentHandler]:
    """The handler class `name`, from the one runnable block that defines it."""
    found = [
        cls for b in RUNNABLE if f"class {name}(" in b.code for n, cls in defined_handlers(b, run_block(b)).items()
        if n == name
    ]  # fmt: skip
    assert len(found) == 1, f"{len(found)} runnable blocks of the guide define {name}"
    return found[0]


def block_defining(text: str) -> Block:
    """The one python block of the guide containing `text`."""
    found = [b for b in PYTHON_BLOCKS if text in b.code]
    assert len(found) == 1, f"{len(found)} python blocks of the guide contain {text!r}"
    return found[0]


def process(server, data_source: str, job_id: str, **fields: Any) -> dict[str, Any]:
    """`POST /process` of one instance; the result as JSON."""
    body = {"job_id": job_id, "instance": {"data_source": data_source, **fields}, "timeout": 60}
    response = server.http.post("/process", json=body)
    assert response.status_code == 200, response.text
    return response.json()


# every block --------------------------------------------------------------------------------------------


def test_the_guide_has_python_blocks_and_few_fragments():
    assert len(PYTHON_BLOCKS) >= 10
    fragments = [str(b) for b in PYTHON_BLOCKS if b.fragment is not None]
    assert len(fragments) <= MAX_FRAGMENTS, f"too many fragments, make some self-contained: {fragments}"
    unexplained = [f"{GUIDE.name}:{n + 1}" for n, line in enumerate(GUIDE.read_text().splitlines())
                   if "<!-- fragment" in line and not FRAGMENT.fullmatch(line.strip())]  # fmt: skip
    assert not unexplained, f"a fragment marker says why: <!-- fragment: why --> ({unexplained})"


@pytest.mark.parametrize("block", PYTHON_BLOCKS, ids=str)
def test_every_python_block_compiles(block):
    compiled(block)


@pytest.mark.parametrize("block", RUNNABLE, ids=str)
def test_every_python_block_not_marked_as_a_fragment_runs_on_its_own(block):
    run_block(block)  # imports included: a reader can paste it into a file and run it


def test_every_handler_the_guide_defines_is_run_through_a_server():
    defined = {name for b in RUNNABLE for name in defined_handlers(b, run_block(b))}
    untested = defined - RUN_HERE - set(COVERED_ELSEWHERE)
    assert not untested, f"run these handlers of the guide through a server in a test, and list them: {untested}"
    assert RUN_HERE | set(COVERED_ELSEWHERE) <= defined, "a handler listed here is no longer in the guide"
    for name, test_file in COVERED_ELSEWHERE.items():
        assert name in (ROOT / test_file).read_text(), f"{test_file} does not run {name}"


# the handlers of the guide, through a server -------------------------------------------------------------


def test_the_complete_handler_retries_once_and_scores_the_last_answer(start_server, backend):
    server = start_server([backend.address], handlers={"capitals": handler_class("CapitalsHandler")()})
    backend.double.push("Lyon", "Paris", job="right-2nd")
    backend.double.push("Lyon", "Marseille", job="wrong")
    backend.double.push("Paris.", job="right-1st")
    fields = {"country": "France", "capital": "Paris"}
    second = process(server, "capitals", "right-2nd", **fields)
    assert (second["status"], second["reward"], second["eval"]) == ("completed", 1.0, {"turns": 2}), second
    assert second["trajectory"]["messages"][2] == {"role": "user", "content": "That is not right. Try once more."}
    wrong = process(server, "capitals", "wrong", **fields)
    assert (wrong["reward"], wrong["eval"], wrong["artifacts"]) == (0.0, {"turns": 2}, {"answer": "Marseille"})
    first = process(server, "capitals", "right-1st", **fields)
    assert (first["reward"], first["eval"]) == (1.0, {"turns": 1})


def test_the_sync_handler_waits_on_the_llm_from_a_thread(start_server, backend):
    server = start_server([backend.address], handlers={"capitals_sync": handler_class("SyncCapitalsHandler")()})
    backend.double.push("Paris.", job="sync-1")
    backend.double.push("Rome", job="sync-2")
    right = process(server, "capitals_sync", "sync-1", country="France", capital="Paris")
    assert (right["status"], right["reward"], right["artifacts"]) == ("completed", 1.0, {"answer": "Paris."})
    assert process(server, "capitals_sync", "sync-2", country="France", capital="Paris")["reward"] == 0.0
    assert [r.params["max_tokens"] for r in backend.double.requests] == [16, 16]


def test_the_workdir_handler_has_its_directory_removed_before_eval(start_server, backend):
    server = start_server([backend.address], handlers={"workdir": handler_class("WorkdirHandler")()})
    result = process(server, "workdir", "wd-1", text="one two three")
    assert result["status"] == "completed", result
    assert (result["reward"], result["eval"], result["artifacts"]) == (1.0, {"workdir_removed": True}, {"words": 3})


@bwrap
@pytest.mark.parametrize(
    ("code", "reward", "exit_code"),
    [
        ("def f(a, b):\n    return a + b\n", 1.0, 0),
        ("def f(a, b):\n    return a * b\n", 0.5, 0),  # 2 * 3 != 5, 0 * 0 == 0
        ("def f(a, b) return a + b\n", 0.0, 1),  # a syntax error: the checker fails
    ],
)
def test_the_function_handler_checks_the_code_in_a_fresh_eval_sandbox(start_server, backend, code, reward, exit_code):
    server = start_server([backend.address], handlers={"function": handler_class("FunctionHandler")()}, runtime="bwrap")
    backend.double.push(code, job="fn-1")
    result = process(server, "function", "fn-1", task="add two numbers", cases=[[[2, 3], 5], [[0, 0], 0]])
    assert result["status"] == "completed", result
    assert (result["reward"], result["eval"]) == (reward, {"exit_code": exit_code})
    assert server.state.orchestrator.sandboxes.live == 0  # the server closed EVAL's sandbox


# the task set convention -----------------------------------------------------------------------------------


def test_the_task_set_convention_loads_the_shipped_file_and_a_trainer_posts_it(
    start_server, backend, tmp_path, monkeypatch
):
    (data,) = guide_blocks("jsonl")
    (toml,) = [b for b in guide_blocks("toml") if "package-data" in b.code]
    loader = block_defining("def load_tasks()")
    trainer = block_defining("def collect(server: str)")
    package = tmp_path / "capitals_plugin"
    (package / "data").mkdir(parents=True)
    (package / "__init__.py").write_text(loader.code)
    (package / "data" / "capitals.jsonl").write_text(data.code)
    patterns = tomllib.loads(toml.code)["tool"]["setuptools"]["package-data"]["capitals_plugin"]
    assert any(fnmatch("data/capitals.jsonl", p) for p in patterns)  # setuptools would ship the file
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "capitals_plugin", raising=False)

    import capitals_plugin

    tasks = capitals_plugin.load_tasks()
    assert tasks == [json.loads(line) for line in data.code.splitlines()] and len(tasks) == 2
    assert all(task["data_source"] == "capitals" for task in tasks)

    server = start_server([backend.address], handlers={"capitals": handler_class("CapitalsHandler")()})
    for task in tasks:
        backend.double.push(task["capital"], prompt=task["country"])
    results = run_block(trainer)["collect"](server.url)
    assert [(r.status.value, r.reward, r.artifacts["answer"]) for r in results] == [
        ("completed", 1.0, "Paris"),
        ("completed", 1.0, "Tokyo"),
    ]
    monkeypatch.delitem(sys.modules, "capitals_plugin")


# what the guide says of ctx.start_sandbox(), ctx.sandbox and the sandbox's calls ----------------------------


class SandboxClaimsHandler(AgentHandler):
    """Records what the guide's sandbox section claims, stage by stage, in `artifacts`."""

    name = "claims"

    def __init__(self, bound_dir: str, host_module_dir: str) -> None:
        self.bound_dir = bound_dir
        self.host_module_dir = host_module_dir  # holds guide_probe.py, importable on the host

    async def init(self, ctx: JobContext) -> None:
        seen = ctx.artifacts.setdefault("seen", {})
        seen["init_before"] = ctx.sandbox is None
        first = await ctx.start_sandbox()
        second = await ctx.start_sandbox()
        seen["init_after"] = ctx.sandbox is first and second is not first
        ctx.state["sandboxes"] = [first, second]

    async def run(self, ctx: JobContext) -> None:
        seen = ctx.artifacts["seen"]
        first, second = ctx.state["sandboxes"]
        seen["run"] = ctx.sandbox is first and not first.closed
        await second.close()
        await second.close()  # closing twice is harmless, and the server closes it again
        seen["run_after_close"] = ctx.sandbox is first and second.closed
        sandbox = ctx.sandbox
        both = await sandbox.bash("echo out; echo err >&2; (exit 3)")
        seen["bash"] = [both.output, both.exit_code, both.timed_out, both.truncated, both.duration_s > 0]
        await sandbox.bash("cd /tmp && export MARK=kept")
        persisted = await sandbox.bash("pwd; echo $MARK")
        seen["persists"] = persisted.output
        slow = await sandbox.bash("sleep 10", timeout=1)
        seen["timeout"] = [slow.timed_out, slow.exit_code]
        cut = await sandbox.bash("seq 1 2000", max_output=100)
        seen["cut"] = [cut.truncated, len(cut.output) < 400, cut.output.startswith("1\n"), "2000" in cut.output]
        seen["write_file"] = await sandbox.write_file("notes/a.txt", "l0\nl1\nl2\n")  # relative, parents made
        seen["tools_write_file"] = await sandbox.tools.write_file("notes/b.txt", "héllo")
        seen["read"] = [
            await sandbox.read_file("/workspace/notes/a.txt"),
            await sandbox.tools.read_file("notes/a.txt", offset=1, limit=1),
        ]
        seen["upload"] = await sandbox.tools.upload("bin/run.sh", b"#!/bin/sh\necho ran\n", mode=0o755)
        seen["run_uploaded"] = (
            await sandbox.bash("/workspace/bin/run.sh", timeout=10)
        ).output  # the shell is in /tmp: file calls resolve against the working directory all the same
        seen["download"] = list(await sandbox.tools.download("notes/b.txt"))
        edit = await sandbox.edit("str_replace", "notes/a.txt", old_str="nowhere", new_str="x")
        seen["edit_refused"] = [edit.success, bool(edit.output)]
        # the server's Python and its installed packages are there; a module in a host directory is not
        probe = f"import sys; sys.path.insert(0, {self.host_module_dir!r}); import guide_probe"
        seen["imports"] = [
            (await sandbox.bash(f'python3 -c "{code}"', timeout=20)).exit_code
            for code in ("import prorl_server", "import pydantic", probe)
        ]
        seen["address"] = sandbox.address
        if importlib.util.find_spec("ipykernel") and importlib.util.find_spec("jupyter_client"):
            cell = await sandbox.ipython("import sys; print('o'); print('e', file=sys.stderr); 1 / 0", timeout=60)
            ok = await sandbox.ipython("print(6 * 7)", timeout=60)
            seen["ipython"] = [
                "o\n" in cell.output and "e\n" in cell.output, cell.exit_code, cell.error_name, cell.timed_out,
                ok.output, ok.exit_code, ok.error_name,
            ]  # fmt: skip
        ctx.state["first"] = first

    async def eval(self, ctx: JobContext) -> dict[str, Any]:
        seen = ctx.artifacts["seen"]
        seen["eval_before"] = ctx.sandbox is None and all(s.closed for s in ctx.state["sandboxes"])
        fresh = await ctx.start_sandbox(SandboxSpec(binds=[Bind(source=self.bound_dir, target="/data")]))
        seen["eval_after"] = ctx.sandbox is fresh and not fresh.closed
        seen["bound"] = await fresh.read_file("/data/input.txt")
        seen["bound_read_only"] = (await fresh.bash("echo x > /data/new.txt")).exit_code != 0
        ctx.state["fresh"] = fresh
        return 1.0

    def final_result(self, ctx: JobContext, result: JobResult) -> JobResult:
        result.eval["final"] = ctx.sandbox is None and ctx.state["fresh"].closed
        return result


@bwrap
def test_what_the_guide_says_of_sandboxes_holds(start_server, backend, tmp_path):
    bound = tmp_path / "bound"
    bound.mkdir()
    (bound / "input.txt").write_text("from the host\n")
    os.chmod(bound, 0o755)  # a root server's sandbox runs as nobody: the guide says "readable by others"
    os.chmod(bound / "input.txt", 0o644)
    (tmp_path / "guide_probe.py").write_text("")
    handler = SandboxClaimsHandler(str(bound), str(tmp_path))
    server = start_server([backend.address], handlers={"claims": handler}, runtime="bwrap")
    result = process(server, "claims", "claims-1")
    assert result["status"] == "completed", result
    seen = result["artifacts"]["seen"]
    assert seen["init_before"] and seen["init_after"] and seen["run"] and seen["run_after_close"]
    assert seen["bash"] == ["out\nerr\n", 3, False, False, True]
    assert seen["persists"] == "/tmp\nkept\n"
    assert seen["timeout"] == [True, None]
    assert seen["cut"] == [True, True, True, True]
    assert (seen["write_file"], seen["tools_write_file"]) == (None, len("héllo".encode()))
    assert seen["read"] == ["l0\nl1\nl2\n", "l1\n"]
    assert (seen["upload"], seen["run_uploaded"]) == (len(b"#!/bin/sh\necho ran\n"), "ran\n")
    assert bytes(seen["download"]) == "héllo".encode()
    assert seen["edit_refused"] == [False, True]
    assert seen["imports"] == [0, 0, 1]
    assert seen["address"] is None  # network "none"
    has_ipython = bool(importlib.util.find_spec("ipykernel") and importlib.util.find_spec("jupyter_client"))
    assert ("ipython" in seen) == has_ipython
    if has_ipython:  # the server's Python, the sandbox's, has ipykernel and jupyter_client
        assert seen["ipython"] == [True, 1, "ZeroDivisionError", False, "42\n", 0, None]
    assert seen["eval_before"] and seen["eval_after"]
    assert (seen["bound"], seen["bound_read_only"]) == ("from the host\n", True)
    assert result["eval"] == {"final": True}
    assert server.state.orchestrator.sandboxes.live == 0

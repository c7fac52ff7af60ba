"""Authoring tasks on the shared agent loop: a conditional end (a submission the model may retry), few-shot
message lists, the trainer's system prompt replacing or appending, no observation after the last turn, the
roles of reminders; and the tool client's typed errors, raised by real sandboxes.

Episodes run through a real server with bubblewrap sandboxes; the scripted test double plays the model."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
from typing import Any

import pytest
from repo_paths import DOCS

from prorl_server import AgentHandler, JobContext
from prorl_server.agent import AgentLoop, Tool, ToolArgumentError, ToolResult, bash_tool, submit_tool
from prorl_server.sandbox.registry import unavailable_reason
from prorl_server.tool_server import client as client_module
from prorl_server.tool_server.errors import (
    ERROR_CLASSES,
    ActionError,
    BadRequest,
    ClientClosed,
    EditRefused,
    FileMissing,
    FileSystemError,
    FileTooLarge,
    IsADirectory,
    SandboxFailure,
    SandboxGone,
    ServerError,
    ToolError,
    ToolTimeout,
    tool_error,
)

pytest_plugins = ("sandbox_fixtures",)
bwrap = pytest.mark.skipif(unavailable_reason("bwrap") is not None, reason=f"bwrap: {unavailable_reason('bwrap')}")

ANSWER = {"type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"]}
WRONG = "That is not the answer; check your work and submit again."
INSTRUCTIONS = "Answer with the submit tool."


def call(name: str, **arguments: Any) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


async def is_42(ctx: JobContext, arguments: dict[str, Any]) -> str | None:
    """A submission check: None accepts, a message rejects."""
    return None if arguments["answer"].strip() == "42" else WRONG


class AuthoringHandler(AgentHandler):
    """An agent on the shared loop; `task` is what `AgentLoop.run` gets, the sandbox is started on demand."""

    name = "authoring"

    def __init__(self, loop: AgentLoop, task: str | list[dict[str, Any]] = "What is 6 * 7?", sandbox: bool = True):
        self.loop = loop
        self.task = task
        self.sandbox = sandbox

    async def init(self, ctx: JobContext) -> None:
        if self.sandbox:
            await ctx.start_sandbox()

    async def run(self, ctx: JobContext) -> None:
        result = await self.loop.run(ctx, self.task)
        ctx.artifacts["submission"] = result.submission
        if self.sandbox:  # what the tools of the last turn did
            ctx.artifacts["marks"] = (await ctx.sandbox.bash("cat /tmp/marks 2>/dev/null")).output

    async def eval(self, ctx: JobContext) -> float:
        return float((ctx.artifacts["submission"] or {}).get("answer") == "42")


def run_job(start_server, backend, handler: AgentHandler, replies: list[str], **sampling: Any) -> dict:
    backend.double.push(*replies)
    server = start_server([backend.address], handlers={"authoring": handler}, runtime="bwrap")
    body = {"instance": {"data_source": "authoring"}, "sampling_params": sampling}
    return server.http.post("/process", json=body).json()


def completed(result: dict) -> dict:
    assert result["status"] == "completed", result
    return result


def assert_ends_with_the_models_turn(traj: dict) -> None:
    """The last response tokens are the last turn's sampled ids, with mask 1: nothing the model never answered."""
    last = traj["turns"][-1]["output_ids"]
    assert traj["response_ids"][-len(last) :] == last
    assert traj["response_mask"][-len(last) :] == [1] * len(last)
    assert traj["messages"][-1]["role"] == "assistant"


def loop(*tools: Tool, **options: Any) -> AgentLoop:
    return AgentLoop([bash_tool(), *tools], INSTRUCTIONS, **options)


# a tool that ends the episode conditionally --------------------------------------------------------------


@bwrap
def test_a_rejected_submission_is_an_observation_and_the_model_retries(start_server, backend):
    handler = AuthoringHandler(loop(submit_tool(parameters=ANSWER, check=is_42)))
    replies = [call("submit", answer="41"), call("submit", answer="42"), "never sampled"]
    result = completed(run_job(start_server, backend, handler, replies))
    assert result["reward"] == 1.0 and result["artifacts"]["submission"] == {"answer": "42"}
    assert result["artifacts"]["agent"] == {
        "stop_reason": "submitted",
        "turns": 2,
        "tool_calls": 2,
        "tool_errors": 0,
        "submitted": True,
    }
    traj = result["trajectory"]
    assert [m["content"] for m in traj["messages"] if m["role"] == "tool"] == [WRONG]
    assert_ends_with_the_models_turn(traj)


@bwrap
def test_a_tool_returning_done_ends_the_episode_and_skips_the_calls_after_it(start_server, backend):
    async def give_up(ctx: JobContext, arguments: dict[str, Any]) -> ToolResult:
        return ToolResult("Keep trying.", done=arguments["reason"] != "retry")

    reason = {"type": "object", "properties": {"reason": {"type": "string"}}, "required": ["reason"]}
    handler = AuthoringHandler(loop(Tool("give_up", "Stop trying.", reason, give_up), submit_tool()))
    replies = [
        call("give_up", reason="retry"),
        call("give_up", reason="too hard") + call("bash", command="echo ran >> /tmp/marks"),
    ]
    result = completed(run_job(start_server, backend, handler, replies))
    assert result["artifacts"]["agent"]["stop_reason"] == "submitted"
    assert result["artifacts"]["submission"] == {"reason": "too hard"}
    assert result["artifacts"]["marks"] == ""  # the call after the ending one did not run
    tool_messages = [m["content"] for m in result["trajectory"]["messages"] if m["role"] == "tool"]
    assert tool_messages == ["Keep trying."]  # an ending result's observation is not appended
    assert_ends_with_the_models_turn(result["trajectory"])


def test_the_submit_tool_says_it_takes_no_arguments():
    with pytest.raises(ToolArgumentError) as caught:
        submit_tool().check({"answer": "42"})
    assert str(caught.value) == "submit has no argument(s) answer; it takes no arguments"
    with pytest.raises(ToolArgumentError, match=r"has no argument\(s\) x; it takes: answer$"):
        submit_tool(parameters=ANSWER).check({"answer": "1", "x": 2})


# how the episode starts ----------------------------------------------------------------------------------


FEW_SHOT = [
    {"role": "user", "content": "What is 2 + 2?"},
    {"role": "assistant", "content": call("submit", answer="4")},
    {"role": "user", "content": "What is 6 * 7?"},
]


@bwrap
def test_an_episode_can_start_from_a_few_shot_message_list(start_server, backend):
    handler = AuthoringHandler(loop(submit_tool(parameters=ANSWER)), task=FEW_SHOT, sandbox=False)
    result = completed(run_job(start_server, backend, handler, [call("submit", answer="42")]))
    assert result["reward"] == 1.0
    traj = result["trajectory"]
    assert traj["messages"][0]["role"] == "system" and traj["messages"][1:4] == FEW_SHOT
    prompt = backend.double.tokenizer.decode(traj["prompt_ids"])
    assert prompt.index("2 + 2") < prompt.index('"answer": "4"') < prompt.index("6 * 7")
    assert prompt.endswith("<|im_start|>assistant\n")  # the model answers the last user message


@bwrap
@pytest.mark.parametrize(
    ("task", "says"),
    [
        ([], "empty"),
        ([{"role": "system", "content": "x"}, {"role": "user", "content": "y"}], "system message"),
        (FEW_SHOT[:2], "end with an assistant message"),
        ([{"content": "no role"}], "string 'role'"),
    ],
)
def test_a_message_list_the_loop_cannot_start_from_fails_the_job(start_server, backend, task, says):
    handler = AuthoringHandler(loop(submit_tool()), task=task, sandbox=False)
    result = run_job(start_server, backend, handler, [])
    assert result["status"] == "failed" and result["error"]["stage"] == "run", result
    assert result["error"]["type"] == "ValueError" and says in result["error"]["message"]


@bwrap
@pytest.mark.parametrize("mode", ["replace", "append"])
def test_the_trainers_system_prompt_replaces_or_appends_as_the_handler_chooses(start_server, backend, mode):
    handler = AuthoringHandler(loop(submit_tool(), system_prompt_mode=mode), sandbox=False)
    result = completed(run_job(start_server, backend, handler, [call("submit")], system_prompt="Think step by step."))
    system = result["trajectory"]["messages"][0]["content"]
    if mode == "replace":
        assert system.startswith("Think step by step.\n\n# Tools") and INSTRUCTIONS not in system
    else:
        assert system.startswith(f"{INSTRUCTIONS}\n\nThink step by step.\n\n# Tools")
    assert '"name": "submit"' in system  # the tool schemas follow either way


def test_the_system_prompt_mode_defaults_to_replace_and_is_checked():
    base = AgentLoop([submit_tool()], "Do it.")
    assert base.system_prompt_mode == "replace"
    assert base.system_instructions({"system_prompt": "Other."}) == "Other."
    assert base.system_instructions({}) == "Do it."
    with pytest.raises(ValueError, match="system_prompt_mode"):
        AgentLoop([submit_tool()], "Do it.", system_prompt_mode="prepend")


# how the episode ends ------------------------------------------------------------------------------------


@bwrap
def test_the_last_allowed_turn_runs_its_tools_but_appends_no_observation(start_server, backend):
    handler = AuthoringHandler(loop(submit_tool(parameters=ANSWER)))
    replies = [call("bash", command=f"echo turn{i} >> /tmp/marks") for i in (1, 2)] + ["never sampled"]
    result = completed(run_job(start_server, backend, handler, replies, max_turns=2))
    assert result["artifacts"]["agent"]["stop_reason"] == "max_turns"
    assert result["artifacts"]["marks"] == "turn1\nturn2\n"  # the last turn's call ran
    traj = result["trajectory"]
    assert len(traj["turns"]) == 2
    assert [m["role"] for m in traj["messages"]] == ["system", "user", "assistant", "tool", "assistant"]
    assert_ends_with_the_models_turn(traj)


@bwrap
def test_a_last_turn_without_a_call_gets_no_reminder(start_server, backend):
    handler = AuthoringHandler(loop(submit_tool()), sandbox=False)
    result = completed(run_job(start_server, backend, handler, ["hmm", "still thinking"], max_turns=2))
    messages = result["trajectory"]["messages"]
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "user", "assistant"]
    assert "No tool call found" in messages[3]["content"]  # the reminder is a user turn, not a tool response
    assert_ends_with_the_models_turn(result["trajectory"])


@bwrap
def test_a_full_context_ends_the_episode_before_the_observations(start_server, backend):
    handler = AuthoringHandler(loop(submit_tool()))
    probe = completed(run_job(start_server, backend, handler, ["x"], max_turns=1))
    limit = len(probe["trajectory"]["prompt_ids"]) + 100 + 5  # room for the first turn only
    replies = [call("bash", command="echo hi >> /tmp/marks"), call("submit")]
    result = completed(run_job(start_server, backend, handler, replies, max_tokens=100, max_context_length=limit))
    assert result["artifacts"]["agent"]["stop_reason"] == "context_length"
    assert result["artifacts"]["marks"] == "hi\n"
    assert_ends_with_the_models_turn(result["trajectory"])


# the guide's example ------------------------------------------------------------------------------------

GUIDE = DOCS / "handlers.md"


def section_blocks(title: str) -> list[str]:
    """The python blocks of a `## title` section of the guide."""
    text = GUIDE.read_text()
    start = text.index(f"## {title}\n")
    end = text.find("\n## ", start + 1)
    return re.findall(r"```python\n(.*?)```", text[start : end if end != -1 else None], re.DOTALL)


@bwrap
def test_the_guides_checked_submission_and_few_shot_example_runs(start_server, backend):
    namespace: dict[str, Any] = {}
    block = section_blocks("Tool-using tasks: the shared agent loop")[1]
    exec(compile(block, str(GUIDE), "exec"), namespace)
    handler = AuthoringHandler(namespace["loop"], task=namespace["few_shot"]("What is 6 * 7?"), sandbox=False)
    replies = [call("submit", answer="forty-two"), call("submit", answer="42")]
    result = completed(run_job(start_server, backend, handler, replies, system_prompt="Be brief."))
    assert result["reward"] == 1.0 and result["artifacts"]["agent"]["turns"] == 2
    messages = result["trajectory"]["messages"]
    assert messages[0]["content"].startswith(
        "You are in a Linux shell. Find the answer with bash, then call submit with it.\n\nBe brief.\n\n# Tools"
    )
    assert messages[1:4] == [*namespace["EXAMPLES"], {"role": "user", "content": "What is 6 * 7?"}]
    assert [m["content"] for m in messages if m["role"] == "tool"] == ["Submit a whole number in digits only, e.g. 12."]


# typed tool errors ---------------------------------------------------------------------------------------


def test_every_error_code_maps_to_its_class_and_keeps_the_code():
    for code, cls in ERROR_CLASSES.items():
        error = tool_error(code, "why", "trace")
        assert type(error) is cls and isinstance(error, ToolError)
        assert (error.error, error.message, error.traceback) == (code, "why", "trace")
    assert isinstance(tool_error("FileNotFoundError", "x"), FileMissing)
    assert isinstance(tool_error("NotADirectoryError", "x"), FileMissing)
    assert isinstance(tool_error("IsADirectoryError", "x"), IsADirectory)
    assert type(tool_error("FileExistsError", "x")) is FileSystemError
    assert isinstance(tool_error("EditError", "x"), EditRefused)
    assert isinstance(tool_error("Timeout", "x"), ToolTimeout) and isinstance(
        tool_error("Timeout", "x"), SandboxFailure
    )
    unknown = tool_error("ZeroDivisionError", "division by zero", "Traceback ...")
    assert type(unknown) is ServerError and unknown.error == "ZeroDivisionError"
    assert str(ToolError("SandboxGone", "old spelling")) == "SandboxGone: old spelling"


def test_the_old_client_errors_constant_warns():
    with pytest.deprecated_call(match="SandboxFailure"):
        codes = client_module.CLIENT_ERRORS
    assert codes == {cls.code for cls in (SandboxGone, ToolTimeout, ClientClosed)} | {"ProtocolError"}


async def test_each_failure_of_a_sandbox_action_raises_its_class(isolated):
    sandbox = await isolated.start()
    with pytest.raises(FileMissing) as missing:
        await sandbox.read_file("/workspace/no/such/file")
    assert missing.value.error == "FileNotFoundError" and "no/such/file" in missing.value.message
    assert isinstance(missing.value, ActionError) and not isinstance(missing.value, SandboxFailure)
    with pytest.raises(IsADirectory):
        await sandbox.read_file("/tmp")
    with pytest.raises(FileSystemError):  # a read-only path of the sandbox
        await sandbox.write_file("/usr/prorl-test.txt", "x")
    await sandbox.write_file("/workspace/a.txt", "alpha\n")
    with pytest.raises(EditRefused, match="did not appear verbatim"):
        await sandbox.tools.request("edit", command="str_replace", path="/workspace/a.txt", old_str="beta", new_str="")
    refused = await sandbox.edit("str_replace", "/workspace/a.txt", old_str="beta", new_str="")
    assert not refused.success and "did not appear verbatim" in refused.output  # the editor's refusal is data
    await sandbox.bash("truncate -s 60M /workspace/big.bin")
    with pytest.raises(FileTooLarge):
        await sandbox.tools.download("/workspace/big.bin")
    with pytest.raises(BadRequest, match="unknown action"):
        await sandbox.tools.request("frobnicate")


async def test_a_call_past_the_clients_deadline_raises_the_timeout_class(isolated):
    sandbox = await isolated.start()
    with pytest.raises(ToolTimeout) as caught:
        await sandbox.tools.request("bash", 0.5, command="sleep 5", timeout=10)
    assert caught.value.error == "Timeout" and isinstance(caught.value, SandboxFailure)
    timed_out = await sandbox.bash("sleep 5", timeout=0.5)  # a command past its own timeout is an observation
    assert timed_out.timed_out and timed_out.exit_code is None


async def test_a_closed_or_crashed_sandbox_raises_the_sandbox_gone_class(isolated):
    crashed, closed = await isolated.start(), await isolated.start()
    for pid in crashed.processes() | {crashed.pid}:  # every process of it, wherever its runtime started them
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    with pytest.raises(SandboxGone) as gone:
        await crashed.bash("true")
    assert gone.value.error == "SandboxGone"
    await closed.close()
    with pytest.raises(SandboxGone) as after_close:
        await closed.read_file("/workspace/a.txt")
    assert isinstance(after_close.value, ClientClosed) and isinstance(after_close.value, SandboxFailure)


@bwrap
def test_a_failed_sandbox_fails_the_job_with_its_class(start_server, backend):
    async def crash(ctx: JobContext, arguments: dict[str, Any]) -> str:
        os.killpg(ctx.sandbox.pid, signal.SIGKILL)
        return "unreachable"

    handler = AuthoringHandler(loop(Tool("crash", "Crash the sandbox.", run=crash), submit_tool()))
    result = run_job(start_server, backend, handler, [call("crash") + call("bash", command="true")])
    assert result["status"] == "failed" and result["error"]["stage"] == "run", result
    assert result["error"]["type"] == "SandboxGone"

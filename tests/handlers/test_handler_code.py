"""The code handler: bash + editor agent loop, hidden tests judged in a fresh sandbox, the shipped problem set."""

from __future__ import annotations

import json

import pytest
from prorl_handlers.code import CodeHandler, load_problems
from prorl_handlers.code.judge import judge, same_output
from trajectory_checks import assert_model_tokens_masked, assert_turns_match_engine, tool_messages

from prorl_server.sandbox.registry import unavailable_reason

pytest_plugins = ("sandbox_fixtures", "engine_fixtures")
pytestmark = pytest.mark.skipif(unavailable_reason("bwrap") is not None, reason=f"bwrap: {unavailable_reason('bwrap')}")

ADD = {
    "data_source": "code",
    "id": "add",
    "statement": "Read two integers a and b and print a + b.\n\nExample input:\n3 4\nExample output:\n7",
    "tests": [
        {"stdin": "3 4\n", "stdout": "7\n"},
        {"stdin": "-5 5\n", "stdout": "0\n"},
        {"stdin": "1000000000000 1\n", "stdout": "1000000000001\n"},
    ],
    "time_limit_s": 1,
}
RIGHT = "a, b = map(int, input().split())\nprint(a + b)   \n\n"  # trailing spaces and lines do not matter


def call(name: str, **arguments: str) -> str:
    """A Hermes tool call as the model writes it."""
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


def create(path: str, text: str) -> str:
    return call("str_replace_editor", command="create", path=path, file_text=text)


@pytest.fixture
def code_server(start_server, backend):
    """A prorl-server with the code handler, the scripted backend and bubblewrap sandboxes."""
    server = start_server([backend.address], handlers={"code": CodeHandler()}, runtime="bwrap")
    yield server
    assert server.state.orchestrator.sandboxes.live == 0  # the agent's sandbox and the judge's were both closed


def process(server, instance: dict, **sampling) -> dict:
    body = {"instance": instance, "sampling_params": {"max_tokens": 512, **sampling}, "timeout": 60}
    return server.http.post("/process", json=body).json()


def test_a_correct_program_written_tested_and_submitted_gets_reward_1(code_server, backend):
    backend.double.push(
        create("/usr/solution.py", RIGHT),  # a read-only path: an error the model reads, not a failed job
        create("/workspace/solution.py", RIGHT),
        "Let me test it. " + call("bash", command="echo 3 4 | python3 /workspace/solution.py"),
        call("submit"),
    )
    result = process(code_server, ADD)

    assert result["status"] == "completed", result["error"]
    assert result["reward"] == 1.0
    assert result["eval"] == {"passed": 3, "total": 3, "failure": None}
    assert result["artifacts"]["solution"] == RIGHT
    assert result["artifacts"]["agent"]["stop_reason"] == "submitted"
    refused, created, ran = tool_messages(result["trajectory"])
    assert refused.startswith("Error: ") and "Read-only file system" in refused
    assert created == "File created successfully at: /workspace/solution.py"
    assert ran.strip() == "7"
    assert_model_tokens_masked(result["trajectory"])


@pytest.mark.parametrize(
    ("program", "kind"),
    [
        ("print(1)\n", "wrong answer"),
        ("while True:\n    pass\n", "time limit"),
        ("data = bytearray(512 << 20)\nprint(len(data))\n", "memory limit"),
        ("raise SystemExit('no')\n", "runtime error"),
    ],
    ids=["wrong-answer", "infinite-loop", "memory-hog", "crash"],
)
def test_a_failing_program_gets_reward_0_and_the_kind_of_failure(code_server, backend, program, kind):
    backend.double.push(create("/workspace/solution.py", program), call("submit"))
    result = process(code_server, ADD)

    assert result["status"] == "completed", result["error"]
    assert result["reward"] == 0.0
    assert result["eval"]["failure"]["kind"] == kind
    assert result["eval"]["failure"]["test"] == 0 and result["eval"]["passed"] == 0
    if kind == "time limit":
        assert result["timing"]["eval_s"] < 10  # tests after the first time limit are not run
    assert_model_tokens_masked(result["trajectory"])


def test_no_program_is_an_empty_solution(code_server, backend):
    backend.double.push("I give up. " + call("submit"))
    result = process(code_server, {**ADD, "solution_path": "/workspace/sub/main.py"})

    assert result["status"] == "completed", result["error"]
    assert result["reward"] == 0.0
    assert result["artifacts"]["solution"] == ""
    assert result["eval"]["failure"]["kind"] == "wrong answer"
    assert "/workspace/sub/main.py" in result["trajectory"]["messages"][1]["content"]


def test_the_memory_limit_comes_from_the_instance(code_server, backend):
    program = "data = bytearray(100 << 20)\na, b = map(int, input().split())\nprint(a + b)\n"
    backend.double.push(create("/workspace/solution.py", program), call("submit"))
    backend.double.push(create("/workspace/solution.py", program), call("submit"))

    assert process(code_server, ADD)["reward"] == 1.0  # 256 MB by default
    assert process(code_server, {**ADD, "memory_mb": 64})["eval"]["failure"]["kind"] == "memory limit"


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"tests": []}, "tests"),
        ({"tests": [{"stdin": "1"}]}, "tests.0.stdout"),
        ({"statement": None}, "statement"),
        ({"solution_path": "solution.py"}, "solution_path"),
        ({"time_limit_s": 0}, "time_limit_s"),
    ],
)
def test_an_invalid_instance_fails_in_init_naming_the_field(code_server, change, message):
    result = process(code_server, {**ADD, **change})

    assert result["status"] == "failed"
    assert result["error"]["stage"] == "init" and result["error"]["type"] == "ValueError"
    assert result["error"]["message"].startswith("invalid code instance: " + message)


def test_outputs_are_compared_ignoring_trailing_whitespace():
    assert same_output("1 2  \n3\n\n\n", "1 2\n3")
    assert same_output("", "\n")
    assert not same_output("1 2\n3\n", "1  2\n3\n")
    assert not same_output("1\n\n3\n", "1\n3\n")


@pytest.mark.parametrize("isolated", ["bwrap"], indirect=True)
async def test_every_shipped_problem_passes_with_its_reference_and_not_with_a_constant_output(isolated):
    problems = load_problems()
    assert len(problems) >= 20 and len({p["id"] for p in problems}) == len(problems)
    sandbox = await isolated.start()  # one sandbox for all of them
    for problem in problems:
        assert problem["data_source"] == "code" and "Example input" in problem["statement"]
        tests = problem["tests"]
        assert len(tests) >= 5
        reference = await judge(sandbox, problem["reference"], tests, path=f"/workspace/{problem['id']}.py")
        assert reference == {"passed": len(tests), "total": len(tests), "failure": None}, problem["id"]
        # a program printing a constant fails: decided without running it, the judge compares just like this
        assert not all(same_output("0\n", t["stdout"]) for t in tests), problem["id"]
        assert not all(same_output("", t["stdout"]) for t in tests), problem["id"]


def test_a_real_model_episode_keeps_the_engines_ids_and_logprobs(start_server, engine):
    server = start_server([engine.address], handlers={"code": CodeHandler()}, runtime="bwrap")
    result = process(server, load_problems()[0], max_tokens=48, max_turns=2, temperature=1.0, seed=7)

    assert result["status"] == "completed", result["error"]
    assert isinstance(result["reward"], float)
    assert isinstance(result["artifacts"]["solution"], str)
    traj = result["trajectory"]
    assert 1 <= len(traj["turns"]) <= 2
    assert_model_tokens_masked(traj)
    assert_turns_match_engine(traj, engine.generations())

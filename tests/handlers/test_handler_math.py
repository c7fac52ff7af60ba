"""The math handler: IPython agent loop, numeric/symbolic grading (sympy only inside a sandbox), real LLM run."""

from __future__ import annotations

import json
import os
import uuid

import pytest
from prorl_handlers.math import MathHandler, grading, load_problems
from prorl_handlers.math.grading import grade, normalize, numeric_match, symbolic_match
from trajectory_checks import assert_model_tokens_masked, assert_turns_match_engine, tool_messages

from prorl_server.sandbox.registry import unavailable_reason

pytest_plugins = ("sandbox_fixtures", "engine_fixtures")
pytestmark = pytest.mark.skipif(unavailable_reason("bwrap") is not None, reason=f"bwrap: {unavailable_reason('bwrap')}")
BWRAP = pytest.mark.parametrize("isolated", ["bwrap"], indirect=True)  # one real sandbox runtime is enough here

QUESTION = {"data_source": "math", "id": "t-1", "question": "What is 6 * 7?", "answer": "42"}
SYMBOLIC = {"data_source": "math", "id": "t-2", "question": "Simplify (x^2 - 9)/(x - 3).", "answer": "x + 3"}


def call(name: str, **arguments: str) -> str:
    """A Hermes tool call as the model writes it."""
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


@pytest.fixture
def math_server(start_server, backend):
    """A prorl-server with the math handler, the scripted backend and bubblewrap sandboxes."""
    server = start_server([backend.address], handlers={"math": MathHandler()}, runtime="bwrap")
    yield server
    assert server.state.orchestrator.sandboxes.live == 0  # INIT's sandbox and EVAL's were both closed


def process(server, instance: dict, **sampling) -> dict:
    body = {"instance": instance, "sampling_params": {"max_tokens": 256, **sampling}, "timeout": 60}
    return server.http.post("/process", json=body).json()


def test_solving_with_ipython_then_submitting_the_right_answer_gets_reward_1(math_server, backend):
    backend.double.push(
        "Let me compute it. " + call("ipython", code="print(6 * 7)"),
        "It is 42. " + call("submit", answer="\\boxed{42}"),
    )
    result = process(math_server, QUESTION)

    assert result["status"] == "completed", result["error"]
    assert result["reward"] == 1.0
    assert result["eval"] == {"correct": True, "method": "numeric", "error": None}
    assert result["artifacts"]["answer"] == "\\boxed{42}"
    assert result["artifacts"]["agent"] == {
        "stop_reason": "submitted", "turns": 2, "tool_calls": 2, "tool_errors": 0, "submitted": True,
    }  # fmt: skip
    traj = result["trajectory"]
    assert tool_messages(traj) == ["42\n"]  # the kernel's output, read by the model
    assert [m["role"] for m in traj["messages"]] == ["system", "user", "assistant", "tool", "assistant"]
    assert "<tools>" in traj["messages"][0]["content"] and '"name": "ipython"' in traj["messages"][0]["content"]
    assert len(traj["turns"]) == 2
    assert_model_tokens_masked(traj)
    observation = [t for t, m in zip(traj["response_ids"], traj["response_mask"], strict=True) if m == 0]
    assert "42" in backend.double.tokenizer.decode(observation)


def test_a_wrong_answer_gets_reward_0(math_server, backend):
    backend.double.push(call("submit", answer="41"))
    result = process(math_server, QUESTION)

    assert result["status"] == "completed", result["error"]
    assert result["reward"] == 0.0
    assert result["eval"]["correct"] is False
    assert_model_tokens_masked(result["trajectory"])


def test_a_malformed_call_is_an_error_observation_and_the_episode_goes_on(math_server, backend):
    backend.double.push(
        '<tool_call>{"name": "ipython", "arguments": {"code": </tool_call>',
        call("submit", answer="3 + x"),  # not a number: compared by sympy in a fresh EVAL sandbox
    )
    result = process(math_server, SYMBOLIC)

    assert result["status"] == "completed", result["error"]
    assert result["reward"] == 1.0
    assert result["eval"] == {"correct": True, "method": "symbolic", "error": None}
    assert result["artifacts"]["agent"]["tool_errors"] == 1
    [observation] = tool_messages(result["trajectory"])
    assert observation.startswith("Error: the tool call is not valid JSON")
    assert_model_tokens_masked(result["trajectory"])


@pytest.mark.parametrize(
    ("instance", "message"),
    [
        ({"data_source": "math", "answer": "1"}, "question"),
        ({"data_source": "math", "question": "1 + 1?"}, "answer"),
        ({"data_source": "math", "question": "", "answer": "2"}, "question"),
    ],
)
def test_an_invalid_instance_fails_in_init_naming_the_field(math_server, instance, message):
    result = process(math_server, instance)

    assert result["status"] == "failed"
    assert result["error"]["stage"] == "init" and result["error"]["type"] == "ValueError"
    assert result["error"]["message"].startswith("invalid math instance: " + message)
    assert result["trajectory"]["turns"] == []


@pytest.mark.parametrize(
    ("answer", "reference", "same"),
    [
        ("1/2", "0.5", True),
        ("\\boxed{42}", "42", True),
        ("$1,000", "1000", True),
        ("\\frac{3}{8}", "0.375", True),
        ("x = 7", "7", True),
        ("50\\%", "50", True),
        ("-(4)/(6)", "-2/3", True),
        ("41", "42", False),
        ("0.333", "1/3", False),
        ("x + 1", "1 + x", None),  # needs sympy
        ("sqrt(4)", "2", None),
        ("__import__('os')", "2", None),
        ("1/0", "5", None),
    ],
)
def test_numeric_match_on_the_host(answer, reference, same):
    assert numeric_match(answer, reference) is same


def test_normalize_strips_markup():
    assert normalize("$\\boxed{\\frac{\\sqrt{2}}{2}}$.") == "(sqrt(2))/(2)"
    assert normalize("\\left(x+1\\right)^{2}") == "(x+1)^(2)"
    assert normalize("x**2 \\cdot 3") == "x^2 * 3"


async def test_numbers_and_empty_answers_are_graded_without_a_sandbox():
    async def no_sandbox():
        raise AssertionError("a plain number must be compared on the host")

    assert (await grade("0.5", "1/2", no_sandbox))["correct"] is True
    assert (await grade("7", "1/2", no_sandbox))["correct"] is False
    assert await grade(None, "1", no_sandbox) == {"correct": False, "method": None, "error": "no answer submitted"}
    assert (await grade("1" * 201, "1", no_sandbox))["error"].startswith("the answer is longer")


@BWRAP
@pytest.mark.parametrize(
    ("answer", "reference", "correct"),
    [
        ("x + 1", "1 + x", True),
        ("x^2 + 6x + 9", "(x + 3)^2", True),
        ("9\\pi", "9*pi", True),
        ("1.4142135623730951", "sqrt(2)", True),
        ("x + 2", "x + 1", False),
        ("2x", "x^2", False),
    ],
)
async def test_symbolic_equivalence_in_a_sandbox(isolated, answer, reference, correct):
    verdict = await symbolic_match(await isolated.start(), answer, reference)
    assert verdict == {"correct": correct, "error": None}


@BWRAP
@pytest.mark.parametrize(
    ("answer", "error"),
    [
        ("the answer is five", "unknown names"),
        ("))((", "Error"),
        ("1, 2", "TypeError"),
        ("(1).n()", "not a decimal point"),
    ],
)
async def test_garbage_is_wrong_with_a_reason(isolated, answer, error):
    verdict = await grade(answer, "5", isolated.start)
    assert verdict["correct"] is False and verdict["method"] == "symbolic"
    assert error in verdict["error"]


@BWRAP
async def test_a_malicious_answer_never_runs_neither_on_the_host_nor_in_the_sandbox(isolated):
    marker = f"/tmp/pwned-{uuid.uuid4().hex}"
    sandboxes = []

    async def start():
        sandboxes.append(await isolated.start())
        return sandboxes[-1]

    verdict = await grade(f"__import__('os').system('touch {marker}')", "0", start)

    assert verdict["correct"] is False and "unsupported characters" in verdict["error"]
    assert not os.path.exists(marker)
    [sandbox] = sandboxes
    assert (await sandbox.bash(f"test -e {marker}")).exit_code == 1


@BWRAP
async def test_a_runaway_comparison_is_stopped_by_the_timeout(isolated, monkeypatch):
    monkeypatch.setattr(grading, "SCORER_TIMEOUT_S", 3)
    verdict = await symbolic_match(await isolated.start(), "9^9^9^9", "1")
    assert verdict == {"correct": False, "error": "the sympy scorer was stopped at its time or memory limit"}


def test_the_shipped_problems_are_valid_instances():
    problems = load_problems()
    assert len(problems) >= 24
    assert len({p["id"] for p in problems}) == len(problems)
    for problem in problems:
        assert set(problem) == {"data_source", "id", "question", "answer"}
        assert problem["data_source"] == "math" and problem["question"] and problem["answer"]


def test_a_real_model_episode_keeps_the_engines_ids_and_logprobs(start_server, engine):
    server = start_server([engine.address], handlers={"math": MathHandler()}, runtime="bwrap")
    result = process(server, load_problems()[0], max_tokens=48, max_turns=2, temperature=1.0, seed=7)

    assert result["status"] == "completed", result["error"]
    assert isinstance(result["reward"], float)
    traj = result["trajectory"]
    assert 1 <= len(traj["turns"]) <= 2
    assert_model_tokens_masked(traj)
    assert_turns_match_engine(traj, engine.generations())

"""The file_question handler: a word in a sandbox file that only a bash call reads, the worked examples, the
tool-use learning task, a real model's episode."""

from __future__ import annotations

import json

import pytest
from prorl_handlers.file_question import FileQuestionHandler, learning_tasks
from prorl_handlers.file_question.handler import EXAMPLES, MAX_FILE_BYTES, READ_CREDIT
from trajectory_checks import assert_model_tokens_masked, assert_turns_match_engine, tool_messages

from prorl_server.sandbox.registry import unavailable_reason

pytest_plugins = ("engine_fixtures",)
pytestmark = pytest.mark.skipif(unavailable_reason("bwrap") is not None, reason=f"bwrap: {unavailable_reason('bwrap')}")

HARBOR = {
    "data_source": "file_question",
    "id": "t-1",
    "question": "What word is written in /workspace/note.txt?",
    "files": {"note.txt": "harbor\n"},
    "answer": "harbor",
}


def cat(path: str) -> str:
    """A Hermes bash call as the model writes it."""
    return f"<tool_call>{json.dumps({'name': 'bash', 'arguments': {'command': f'cat {path}'}})}</tool_call>"


@pytest.fixture
def file_server(start_server, backend):
    """A prorl-server with the file_question handler, the scripted backend and bubblewrap sandboxes."""
    server = start_server([backend.address], handlers={"file_question": FileQuestionHandler()}, runtime="bwrap")
    yield server
    assert server.state.orchestrator.sandboxes.live == 0


def process(server, instance: dict, *, timeout: float = 60, **sampling) -> dict:
    body = {"instance": instance, "sampling_params": {"max_tokens": 256, **sampling}, "timeout": timeout}
    return server.http.post("/process", json=body, timeout=timeout + 30).json()


def test_reading_the_file_then_saying_the_word_gets_reward_1(file_server, backend):
    backend.double.push(cat("/workspace/note.txt"), "Harbor.")
    result = process(file_server, HARBOR)

    assert result["status"] == "completed", result["error"]
    assert result["reward"] == 1.0
    assert result["eval"] == {"correct": True, "read": True, "expected": "harbor", "tool_calls": 1}
    assert result["artifacts"]["answer"] == "Harbor."
    traj = result["trajectory"]
    assert tool_messages(traj)[-1] == "harbor\n"  # the file's content, read by the model in the sandbox
    roles = [m["role"] for m in traj["messages"]]
    assert roles == ["system", *(m["role"] for m in EXAMPLES), "user", "assistant", "tool", "assistant"]
    assert traj["messages"][len(EXAMPLES) + 1]["content"] == HARBOR["question"]
    assert len(traj["turns"]) == 2
    assert_model_tokens_masked(traj)  # the examples and the file's content are observations: mask 0


@pytest.mark.parametrize(
    ("replies", "reward", "answer"),
    [
        (["harbour"], 0.0, "harbour"),  # a guess, not the word
        ([cat("/workspace/other.txt"), "I could not find it."], 0.0, "I could not find it."),  # a wrong file
        ([cat("/workspace/note.txt"), "lemon"], READ_CREDIT, "lemon"),  # read, then not said
        ([cat("/workspace/note.txt")] * 2, READ_CREDIT, None),  # read, then a call again: no answer
    ],
)
def test_no_answer_or_a_wrong_one_gets_the_read_credit_or_0(file_server, backend, replies, reward, answer):
    backend.double.push(*replies)
    result = process(file_server, HARBOR)

    assert result["status"] == "completed", result["error"]
    assert result["reward"] == reward and result["eval"]["correct"] is False
    assert result["eval"]["read"] is (reward == READ_CREDIT)
    assert result["artifacts"]["answer"] == answer


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"files": {"/etc/passwd": "x"}}, "files: Value error, file name '/etc/passwd' must be a relative path"),
        ({"files": {"../up.txt": "x"}}, "files: Value error, file name '../up.txt' must be a relative path"),
        ({"files": {"big.txt": "x" * (MAX_FILE_BYTES + 1)}}, "files: Value error, file 'big.txt' is over"),
        ({"files": {}}, "files: Dictionary should have at least 1 item"),
        ({"answer": " "}, "answer: String should match pattern"),
    ],
)
def test_an_invalid_instance_fails_in_init_naming_the_field(file_server, change, message):
    result = process(file_server, HARBOR | change)

    assert result["status"] == "failed"
    assert result["error"]["stage"] == "init" and result["error"]["type"] == "ValueError"
    assert result["error"]["message"].startswith("invalid file_question instance: " + message)


def test_the_learning_task_splits_share_no_word_and_only_the_file_holds_it():
    train, held_out = learning_tasks("train"), learning_tasks("held_out")
    assert len(held_out) == 24 and len(train) >= 4 * len(held_out)
    assert not {t["answer"] for t in train} & {t["answer"] for t in held_out}
    for task in train + held_out:
        (name, content), path = next(iter(task["files"].items())), task["question"].split()[-1].rstrip("?")
        assert path == f"/workspace/{name}" and content.strip() == task["answer"]
        assert task["answer"] not in task["question"]
    assert not {t["answer"] for t in held_out} & {m["content"].strip() for m in EXAMPLES}


def test_a_real_model_episode_keeps_the_engines_ids_and_logprobs(start_server, engine):
    server = start_server([engine.address], handlers={"file_question": FileQuestionHandler()}, runtime="bwrap")
    # a real engine reads the worked examples' 500 prompt tokens first: a longer budget on a loaded machine
    result = process(server, learning_tasks("held_out")[0], timeout=180, max_tokens=24, temperature=1.0, seed=7)

    assert result["status"] == "completed", result["error"]
    assert result["reward"] in (0.0, 1.0)
    traj = result["trajectory"]
    assert 1 <= len(traj["turns"]) <= 2
    assert_model_tokens_masked(traj)
    assert_turns_match_engine(traj, engine.generations())

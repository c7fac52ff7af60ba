"""The short_answer handler: plain chat turns (no sandbox), a lenient answer check, a real LLM run."""

from __future__ import annotations

import pytest
from prorl_handlers.short_answer import ShortAnswerHandler, contains_answer, load_questions
from prorl_handlers.short_answer.handler import RETRY
from trajectory_checks import assert_model_tokens_masked, assert_turns_match_engine

pytest_plugins = ("engine_fixtures",)

SKY = {"data_source": "short_answer", "id": "t-1", "question": "What color is the sky? One word.", "answer": "blue"}
SUM = {"data_source": "short_answer", "id": "t-2", "question": "What is 2+2? Answer with a number.", "answer": 4}


@pytest.fixture
def short_server(start_server, backend):
    """A prorl-server with the short_answer handler and the scripted backend (no sandbox runtime needed)."""
    server = start_server([backend.address], handlers={"short_answer": ShortAnswerHandler()})
    yield server
    assert server.state.orchestrator.sandboxes.live == 0  # the handler never starts one


def process(server, instance: dict, **sampling) -> dict:
    body = {"instance": instance, "sampling_params": {"max_tokens": 32, **sampling}, "timeout": 60}
    return server.http.post("/process", json=body).json()


@pytest.mark.parametrize(
    ("reply", "instance", "reward"),
    [
        ("Blue.", SKY, 1.0),
        ("The sky is BLUE, mostly.", SKY, 1.0),
        ("bluegrass", SKY, 0.0),  # a whole word, not a part of one
        ("It is grey today.", SKY, 0.0),
        ("2 + 2 = 4", SUM, 1.0),
        ("The answer is 24.", SUM, 0.0),  # a whole number, not a digit of one
        ("", SUM, 0.0),
    ],
)
def test_the_reply_is_scored_leniently(short_server, backend, reply, instance, reward):
    backend.double.push(reply)
    result = process(short_server, instance)

    assert result["status"] == "completed", result["error"]
    assert result["reward"] == reward
    assert result["eval"] == {"correct": reward == 1.0, "expected": str(instance["answer"]), "turns": 1}
    assert result["artifacts"]["answer"] == reply.strip()
    traj = result["trajectory"]
    assert [m["role"] for m in traj["messages"]] == ["user", "assistant"]
    assert traj["messages"][0]["content"] == instance["question"]
    assert len(traj["turns"]) == 1
    assert_model_tokens_masked(traj)


def test_with_two_turns_a_wrong_reply_is_told_so_and_the_second_try_counts(short_server, backend):
    backend.double.push("Green.", "Blue!")
    result = process(short_server, SKY, max_turns=2)

    assert result["status"] == "completed", result["error"]
    assert result["reward"] == 1.0 and result["eval"]["turns"] == 2
    traj = result["trajectory"]
    assert [m["role"] for m in traj["messages"]] == ["user", "assistant", "user", "assistant"]
    assert traj["messages"][2]["content"] == RETRY
    assert_model_tokens_masked(traj)  # the retry message is an observation: mask 0


def test_a_right_first_reply_ends_the_episode_even_with_more_turns_allowed(short_server, backend):
    backend.double.push("blue")
    result = process(short_server, SKY, max_turns=3)

    assert result["reward"] == 1.0 and len(result["trajectory"]["turns"]) == 1


@pytest.mark.parametrize(
    ("instance", "message"),
    [
        ({"data_source": "short_answer", "answer": "blue"}, "question"),
        ({"data_source": "short_answer", "question": "Sky color?"}, "answer"),
        ({"data_source": "short_answer", "question": "", "answer": "blue"}, "question"),
        ({"data_source": "short_answer", "question": "Sky color?", "answer": "  "}, "answer is empty"),
    ],
)
def test_an_invalid_instance_fails_in_init_naming_the_field(short_server, instance, message):
    result = process(short_server, instance)

    assert result["status"] == "failed"
    assert result["error"]["stage"] == "init" and result["error"]["type"] == "ValueError"
    assert result["error"]["message"].startswith("invalid short_answer instance: " + message)
    assert result["trajectory"]["turns"] == []


@pytest.mark.parametrize(
    ("reply", "answer", "correct"),
    [
        ("Paris", "paris", True),
        ("paris, France", "Paris", True),
        ("Comparison", "paris", False),
        ("1081.", "1081", True),
        ("10811", "1081", False),
        ("x=4", "4", True),
        (None, "4", False),
    ],
)
def test_contains_answer(reply, answer, correct):
    assert contains_answer(reply, answer) is correct


def test_the_shipped_questions_are_valid_instances_with_easy_and_hard_ones():
    questions = load_questions()
    assert len(questions) >= 20
    assert len({q["id"] for q in questions}) == len(questions)
    for question in questions:
        assert set(question) == {"data_source", "id", "question", "answer"}
        assert question["data_source"] == "short_answer" and question["question"] and question["answer"]
    answers = {q["answer"] for q in questions}
    assert {"apple", "4"} <= answers  # easy: the 135M model gets these right some of the time
    assert {"xylophage", "1081"} <= answers  # hard: it almost never does


def test_a_real_model_episode_keeps_the_engines_ids_and_logprobs(start_server, engine):
    server = start_server([engine.address], handlers={"short_answer": ShortAnswerHandler()})
    result = process(server, load_questions()[0], max_tokens=24, max_turns=2, temperature=1.0, seed=7)

    assert result["status"] == "completed", result["error"]
    assert result["reward"] in (0.0, 1.0)
    assert result["reward"] == float(contains_answer(result["artifacts"]["answer"], load_questions()[0]["answer"]))
    traj = result["trajectory"]
    assert 1 <= len(traj["turns"]) <= 2
    assert_model_tokens_masked(traj)
    assert_turns_match_engine(traj, engine.generations())

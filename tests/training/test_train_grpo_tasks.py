"""`examples/train_grpo.py`'s learning tasks and flags (the runs themselves: test_training_vllm.py)."""

from __future__ import annotations

import importlib.util
import sys

import pytest
from repo_paths import EXAMPLES


@pytest.fixture(scope="module")
def train_grpo():
    spec = importlib.util.spec_from_file_location("train_grpo_example", EXAMPLES / "train_grpo.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    yield module
    del sys.modules[spec.name]


@pytest.mark.parametrize(("task", "max_tokens", "max_turns"), [("echo", 12, 2), ("file_question", 40, 2)])
def test_a_task_brings_its_reply_length_and_turns_unless_given(train_grpo, task, max_tokens, max_turns):
    config, _ = train_grpo.parse_args(["--task", task])
    assert (config.task, config.max_tokens, config.max_turns) == (task, max_tokens, max_turns)
    config, _ = train_grpo.parse_args(["--task", task, "--max-tokens", "30", "--max-turns", "3"])
    assert (config.max_tokens, config.max_turns) == (30, 3)
    assert config.sampling(1.0, 5) == {"temperature": 1.0, "max_tokens": 30, "seed": 5}


@pytest.mark.parametrize(
    "argv", [["--task", "nope"], ["--final-eval-k", "-1"], ["--max-tokens", "0"], ["--group-size", "1"]]
)
def test_bad_flags_are_refused_before_anything_starts(train_grpo, argv, capsys):
    with pytest.raises(SystemExit) as exit_info:
        train_grpo.parse_args(argv)
    assert exit_info.value.code == 2 and "error:" in capsys.readouterr().err


@pytest.mark.parametrize("task", ["echo", "file_question"])
def test_each_task_has_disjoint_train_and_held_out_instances_of_its_handler(train_grpo, task):
    learning = train_grpo.TASKS[task]
    train, held_out = learning.instances("train"), learning.instances("held_out")
    assert len(held_out) == 24 and len(train) > len(held_out)
    assert {t["data_source"] for t in train + held_out} == {learning.handler}
    assert not {t["answer"] for t in train} & {t["answer"] for t in held_out}

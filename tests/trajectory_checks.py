"""Checks of a returned trajectory shared by the handler tests: model tokens, observation tokens, engine record."""

from __future__ import annotations

from typing import Any


def assert_model_tokens_masked(traj: dict[str, Any]) -> None:
    """Mask 1 exactly on each turn's sampled ids (with its logprobs); 0 and logprob 0.0 everywhere else."""
    ids, mask, logprobs = traj["response_ids"], traj["response_mask"], traj["response_logprobs"]
    assert len(ids) == len(mask) == len(logprobs)
    expected = [0] * len(ids)
    for turn in traj["turns"]:
        start = turn["prompt_len"] - len(traj["prompt_ids"])
        end = start + len(turn["output_ids"])
        assert ids[start:end] == turn["output_ids"]
        assert logprobs[start:end] == turn["logprobs"]
        expected[start:end] = [1] * (end - start)
    assert mask == expected
    assert all(lp == 0.0 for lp, m in zip(logprobs, mask, strict=True) if m == 0)


def assert_turns_match_engine(traj: dict[str, Any], generations: list[Any]) -> None:
    """Each turn carries exactly the ids and logprobs the engine sampled from that turn's context."""
    stream = traj["prompt_ids"] + traj["response_ids"]
    assert traj["turns"]
    for turn in traj["turns"]:
        context = stream[: turn["prompt_len"]]
        matches = [g for g in generations if list(g.prompt_ids) == context]
        assert matches, "the engine recorded no request with this turn's context"
        assert list(matches[-1].output_ids) == turn["output_ids"]
        assert list(matches[-1].logprobs) == turn["logprobs"]


def tool_messages(traj: dict[str, Any]) -> list[str]:
    """The observation texts the model read, in order."""
    return [str(m["content"]) for m in traj["messages"] if m["role"] == "tool"]

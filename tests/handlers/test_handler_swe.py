"""The `swe` handler (handlers/src/prorl_handlers/swe): the shipped instances, scripted episodes through a real
server with bubblewrap sandboxes, and one episode of the real dev LLM."""

from __future__ import annotations

import asyncio
import dataclasses
import difflib
import json
from typing import Any

import pytest
from prorl_handlers.swe import SWEHandler, SWEInstance, load_instances
from prorl_handlers.swe.evaluate import evaluate
from prorl_handlers.swe.handler import REPOS_DIR
from prorl_handlers.swe.repo import RepositoryError, build_local, materialize, repo_dir

from prorl_server.sandbox import SandboxSpec, make_runtime, new_owner_id
from prorl_server.sandbox.reaper import reap, remove_owner_files
from prorl_server.sandbox.registry import unavailable_reason

pytest_plugins = ("sandbox_fixtures", "engine_fixtures")

BWRAP = unavailable_reason("bwrap")
needs_bwrap = pytest.mark.skipif(BWRAP is not None, reason=f"bwrap: {BWRAP}")
INSTANCES = load_instances()
TRUNCATE = next(i for i in INSTANCES if i["instance_id"] == "textkit-3")
WRAP_PY = "/workspace/textkit/textkit/wrap.py"
GOLD_OLD, GOLD_NEW = (
    "    return text[:limit] + suffix\n",
    "    keep = max(limit - len(suffix), 0)\n    return (text[:keep] + suffix)[:limit]\n",
)


def call(name: str, **arguments: Any) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


def check_mask(trajectory: dict[str, Any]) -> None:
    """Mask 1 exactly on the tokens each turn sampled (ids and logprobs as recorded), 0 and logprob 0.0 elsewhere."""
    offset = len(trajectory["prompt_ids"])
    expected_mask = [0] * len(trajectory["response_ids"])
    for turn in trajectory["turns"]:
        start, end = turn["prompt_len"] - offset, turn["prompt_len"] - offset + len(turn["output_ids"])
        assert trajectory["response_ids"][start:end] == turn["output_ids"]
        assert trajectory["response_logprobs"][start:end] == turn["logprobs"]
        expected_mask[start:end] = [1] * (end - start)
    assert trajectory["response_mask"] == expected_mask
    assert all(lp == 0.0 for lp, m in zip(trajectory["response_logprobs"], expected_mask, strict=True) if m == 0)


def fake_passes_patch(instance: dict[str, Any]) -> str:
    """A textkit patch that fixes nothing but prints a PASSED line for each FAIL_TO_PASS test when Python exits."""
    init = (REPOS_DIR / "textkit/textkit/__init__.py").read_text()
    fakes = "".join(f'atexit.register(print, "PASSED {test}")\n' for test in instance["FAIL_TO_PASS"])
    lines = init.splitlines(keepends=True), ("import atexit\n" + fakes + init).splitlines(keepends=True)
    return "".join(difflib.unified_diff(*lines, "a/textkit/__init__.py", "b/textkit/__init__.py"))


# instances ---------------------------------------------------------------------------------------


def test_instances_read_both_test_list_forms_and_name_what_is_missing():
    encoded = {**TRUNCATE, "FAIL_TO_PASS": json.dumps(TRUNCATE["FAIL_TO_PASS"])}
    assert SWEInstance.from_dict(encoded) == SWEInstance.from_dict(TRUNCATE)
    with pytest.raises(ValueError, match="lacks base_commit, test_patch"):
        SWEInstance.from_dict({k: v for k, v in TRUNCATE.items() if k not in ("base_commit", "test_patch")})
    with pytest.raises(ValueError, match="PASS_TO_PASS must be a list"):
        SWEInstance.from_dict({**TRUNCATE, "PASS_TO_PASS": '"tests/x.py::y"'})
    for repo in ("nosuch", "../repos/textkit", str(REPOS_DIR / "textkit")):
        with pytest.raises(RepositoryError, match=r"SWEHandler\(repos_dir"):
            repo_dir(REPOS_DIR, repo)


def test_base_commits_are_reproducible(tmp_path):
    assert len(INSTANCES) >= 20
    for repo in sorted({i["repo"] for i in INSTANCES}):
        commits = {build_local(REPOS_DIR / repo, tmp_path / f"{repo}-{n}") for n in range(2)}
        assert commits == {i["base_commit"] for i in INSTANCES if i["repo"] == repo}, repo


@needs_bwrap
async def test_every_instance_passes_with_its_gold_patch_and_fails_without():
    """Each instance, materialized in a sandbox (which checks base_commit), scored with the gold patch and with an
    empty patch; once with a patch that does not apply and once with one faking pytest's PASSED lines. Two
    sandboxes score in parallel."""
    owner = new_owner_id()
    runtime = make_runtime("bwrap", owner)
    jobs = [(i, kind) for i in INSTANCES for kind in ("gold", "empty")] + [(TRUNCATE, "broken"), (TRUNCATE, "cheat")]
    patches = {
        "empty": lambda i: "",
        "gold": lambda i: i["patch"],
        "broken": lambda i: i["patch"].replace("-", "+"),
        "cheat": fake_passes_patch,
    }
    results: dict[tuple[str, str], dict[str, Any]] = {}

    async def lane(lane_jobs: list[tuple[dict[str, Any], str]]) -> None:
        sandbox = await runtime.start(SandboxSpec())
        try:
            for n, (instance, kind) in enumerate(lane_jobs):
                task = dataclasses.replace(SWEInstance.from_dict(instance), repo=f"{n}/{instance['repo']}")
                await materialize(sandbox, REPOS_DIR / instance["repo"], task.workdir, task.base_commit)
                results[instance["instance_id"], kind] = await evaluate(sandbox, task, patches[kind](instance), 60)
        finally:
            await sandbox.close()

    try:
        await asyncio.gather(lane(jobs[0::2]), lane(jobs[1::2]))
    finally:
        runtime.close()
        reap(owner=owner)
        remove_owner_files(owner)
    for instance in INSTANCES:
        gold, empty = results[instance["instance_id"], "gold"], results[instance["instance_id"], "empty"]
        assert gold["reward"] == 1.0, (instance["instance_id"], gold)
        assert gold["FAIL_TO_PASS_failed"] == gold["PASS_TO_PASS_failed"] == []
        assert empty["reward"] == 0.0, (instance["instance_id"], empty)
        assert empty["FAIL_TO_PASS_failed"] == instance["FAIL_TO_PASS"] and empty["PASS_TO_PASS_failed"] == []
    cheat = results["textkit-3", "cheat"]
    assert cheat["reward"] == 0.0 and cheat["FAIL_TO_PASS_failed"] == TRUNCATE["FAIL_TO_PASS"]
    assert "PASSED tests/test_truncate.py::test_result_fits_the_limit" in cheat["test_log"].rpartition(" in ")[2]
    broken = results["textkit-3", "broken"]
    assert broken["reward"] == 0.0 and not broken["patch_applied"]
    assert broken["error"].startswith("the model patch does not apply")


# scripted episodes through a real server ---------------------------------------------------------

CORRECT = [
    call("bash", command="pwd && grep -n suffix textkit/wrap.py"),
    call("str_replace_editor", command="str_replace", path=WRAP_PY, old_str=GOLD_OLD, new_str=GOLD_NEW),
    call("submit"),
]
WRONG = [  # hard-codes the length of the default suffix
    call(
        "str_replace_editor",
        command="str_replace",
        path=WRAP_PY,
        old_str=GOLD_OLD,
        new_str="    return text[: limit - 3] + suffix\n",
    ),
    call("submit"),
]
BREAKS_PASS_TO_PASS = [  # right for long texts, but short texts now get the suffix too
    call(
        "str_replace_editor",
        command="str_replace",
        path=WRAP_PY,
        old_str="    if len(text) <= limit:\n        return text\n" + GOLD_OLD,
        new_str=GOLD_NEW,
    ),
    call("submit"),
]
TOUCHES_TESTS_NO_SUBMIT = [  # edits a test file the test patch also changes, adds a file, never submits
    call("bash", command="echo 'def test_mine(): pass' >> tests/test_truncate.py && echo note > NOTES.txt")
    + call("str_replace_editor", command="str_replace", path=WRAP_PY, old_str=GOLD_OLD, new_str=GOLD_NEW),
    "I think that is all.",
]


def run_swe_job(start_server, backend, replies: list[str], **sampling: Any) -> dict[str, Any]:
    backend.double.push(*replies)
    server = start_server([backend.address], handlers={"swe": SWEHandler()}, runtime="bwrap")
    result = server.http.post("/process", json={"instance": TRUNCATE, "sampling_params": sampling}).json()
    assert result["status"] == "completed", result
    check_mask(result["trajectory"])
    return result


@needs_bwrap
def test_a_correct_fix_scores_1_and_its_diff_is_the_patch(start_server, backend):
    result = run_swe_job(start_server, backend, CORRECT)
    assert result["reward"] == 1.0, result["eval"]
    assert result["artifacts"]["patch"] == TRUNCATE["patch"]  # the same change as the gold patch, byte for byte
    assert result["artifacts"]["agent"]["stop_reason"] == "submitted"
    observations = [m["content"] for m in result["trajectory"]["messages"] if m["role"] == "tool"]
    assert observations[0].startswith("/workspace/textkit\n")  # the shell starts in the checkout
    assert len(result["trajectory"]["turns"]) == 3


@needs_bwrap
def test_a_wrong_fix_scores_0(start_server, backend):
    result = run_swe_job(start_server, backend, WRONG)
    assert result["reward"] == 0.0
    assert result["eval"]["FAIL_TO_PASS_failed"] == [
        "tests/test_truncate.py::test_a_custom_suffix_counts_towards_the_limit",
        "tests/test_truncate.py::test_limit_shorter_than_the_suffix",
    ]
    assert result["eval"]["PASS_TO_PASS_failed"] == []
    assert "FAILED tests/test_truncate.py::test_limit_shorter_than_the_suffix" in result["eval"]["test_log"]


@needs_bwrap
def test_a_fix_that_breaks_passing_tests_scores_0(start_server, backend):
    result = run_swe_job(start_server, backend, BREAKS_PASS_TO_PASS)
    assert result["reward"] == 0.0
    assert result["eval"]["FAIL_TO_PASS_failed"] == []
    assert result["eval"]["PASS_TO_PASS_failed"] == [
        "tests/test_truncate.py::test_short_text_is_unchanged",
        "tests/test_truncate.py::test_text_of_exactly_the_limit_is_unchanged",
    ]


@needs_bwrap
def test_the_diff_is_taken_without_submit_and_edited_test_files_are_reset(start_server, backend):
    result = run_swe_job(start_server, backend, TOUCHES_TESTS_NO_SUBMIT, max_turns=2)
    assert result["artifacts"]["agent"]["stop_reason"] == "max_turns"
    patch = result["artifacts"]["patch"]
    assert "b/NOTES.txt" in patch and "+def test_mine(): pass" in patch and "b/textkit/wrap.py" in patch
    assert result["reward"] == 1.0, result["eval"]  # the test patch applied on the reset test file


@needs_bwrap
def test_a_group_checks_out_once_and_each_member_fixes_its_own_fork(start_server, backend):
    handler = SWEHandler()
    if handler.fork_after_init and make_runtime("bwrap", new_owner_id()).fork_unavailable() is not None:
        pytest.skip("bubblewrap forks sandboxes for a server running as root only")
    checkouts = []
    init = handler.init

    async def counted_init(ctx):
        checkouts.append(ctx.job_id)
        await init(ctx)

    handler.init = counted_init
    backend.double.push(*CORRECT, *WRONG)  # one RUN at a time: the first member fixes, the second does not
    server = start_server([backend.address], handlers={"swe": handler}, runtime="bwrap", run_workers=1)
    group = server.http.post("/groups", json={"instance": TRUNCATE, "n": 2, "group_id": "swe"}).json()
    assert group["status"] == "completed", group
    assert len(checkouts) == 1  # INIT once for the group
    results = [server.http.get(f"/jobs/{m['job_id']}").json()["result"] for m in group["members"]]
    assert sorted(r["reward"] for r in results) == [0.0, 1.0]  # each scored on its own fork's diff
    assert {r["artifacts"]["patch"] == TRUNCATE["patch"] for r in results} == {True, False}


# the real dev LLM --------------------------------------------------------------------------------


@needs_bwrap
def test_a_real_model_episode_records_exactly_what_the_engine_sampled(start_server, engine):
    server = start_server([engine.address], handlers={"swe": SWEHandler()}, runtime="bwrap")
    sampling = {"max_tokens": 48, "max_turns": 2, "temperature": 1.0, "seed": 7, "tool_timeout": 10}
    result = server.http.post("/process", json={"instance": TRUNCATE, "sampling_params": sampling}).json()
    assert result["status"] == "completed", result
    assert result["reward"] in (0.0, 1.0)
    trajectory = result["trajectory"]
    check_mask(trajectory)
    context = trajectory["prompt_ids"] + trajectory["response_ids"]
    generations = engine.generations()
    assert 1 <= len(trajectory["turns"]) <= 2
    for turn in trajectory["turns"]:
        generation = [g for g in generations if g.prompt_ids == context[: turn["prompt_len"]]][-1]
        assert turn["output_ids"] == generation.output_ids
        assert turn["logprobs"] == generation.logprobs
    assert isinstance(result["artifacts"]["patch"], str)

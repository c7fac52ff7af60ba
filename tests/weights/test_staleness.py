"""Bounded staleness: a job whose oldest turn is more than `max_staleness` weight versions behind the weights
of its next turn ends as `stale` (policy "end", partial trajectory kept) or goes on ("continue")."""

from __future__ import annotations

import time

import pytest
from polling import wait_for
from pydantic import ValidationError
from server_jobs import JOB, result, submit

from prorl_server.cli import build_parser, settings_from_args
from prorl_server.client import SyncRolloutClient
from prorl_server.config import ServerSettings
from prorl_server.handlers import AgentHandler, JobContext
from prorl_server.llm.session import StaleRollout
from prorl_server.protocol import TERMINAL_STATUSES, JobResult, JobStatus
from prorl_server.testing import ScriptedReply


def versioned_server(start_server, backend, version, **settings):
    server = start_server([], **settings)
    added = server.http.post("/add_llm_server", json={"address": backend.address, "weight_version": version})
    assert added.status_code == 200, added.text
    return server


def bump(server, version, mode: str = "wait") -> None:
    """A weight update: pause (answers once nothing is in flight), set `version`, resume."""
    paused = server.http.post("/weights/pause", json={"mode": mode})
    assert paused.status_code == 200 and paused.json()["drained"], paused.text
    assert server.http.post("/weights/update", json={"version": version}).status_code == 200
    assert server.http.post("/weights/resume").status_code == 200


def completions_sent(backend, n: int) -> None:
    wait_for(lambda: len(backend.double.requests) >= n, 10, f"{n} completion(s) were sent")


def versions(res: dict) -> list:
    return [t["weight_version"] for t in res["trajectory"]["turns"]]


def test_alpha_zero_ends_a_job_whose_first_turn_was_under_the_old_version(start_server, backend):
    server = versioned_server(start_server, backend, 1, max_staleness=0)  # the server's setting
    backend.double.push(ScriptedReply(text="first turn", delay_s=0.5), "DONE")
    submit(server, "j")
    completions_sent(backend, 1)
    bump(server, 2)  # answers after the first turn finished under v1

    res = result(server, "j")
    assert res["status"] == "stale", res
    assert res["reward"] is None
    error = res["error"]
    assert error["type"] == "StaleRollout" and error["stage"] == "run"
    assert "1 version(s) behind" in error["message"] and "max_staleness is 0" in error["message"]
    # the partial trajectory is kept: the prompt, the first turn and its observation
    traj = res["trajectory"]
    assert versions(res) == [1] and traj["weight_versions"] == [1]
    assert traj["turns"][0]["text"] == "first turn"
    assert traj["prompt_ids"] and 0 in traj["response_mask"] and 1 in traj["response_mask"]
    assert len(traj["response_ids"]) == len(traj["response_mask"]) == len(traj["response_logprobs"])
    assert len(backend.double.requests) == 1  # the stale turn was never sent
    assert JobResult.model_validate(res).status is JobStatus.STALE
    with SyncRolloutClient(server.url) as client:  # the trainer client takes it as terminal
        waited = client.jobs.wait("j", timeout=10)
        assert waited.status is JobStatus.STALE and waited.trajectory.weight_versions == [1]

    # listed and counted like any finished result
    listed = server.http.get("/jobs", params={"status": "stale"})
    assert listed.status_code == 200 and [r["job_id"] for r in listed.json()["results"]] == ["j"]
    assert server.http.get("/jobs", params={"status": "completed"}).json()["results"] == []
    assert server.http.get("/status").json()["jobs"]["stored_results"] == 1


@pytest.mark.parametrize("vs", [(1, 2, 3), ("policy-a", "policy-b", "policy-c")])
def test_alpha_one_continues_one_version_behind_and_ends_two_behind(start_server, backend, vs):
    """Integers count their difference, strings their distance in the order the versions were set."""
    server = versioned_server(start_server, backend, vs[0])
    backend.double.push(ScriptedReply(text="one", delay_s=0.5), ScriptedReply(text="two", delay_s=0.5), "DONE")
    submit(server, "j", max_staleness=1)  # the job's own bound (the server has none)
    completions_sent(backend, 1)
    bump(server, vs[1])
    completions_sent(backend, 2)  # one version behind: the second turn is sampled, under the new version
    bump(server, vs[2])

    res = result(server, "j")
    assert res["status"] == "stale", res
    assert versions(res) == [vs[0], vs[1]] and res["trajectory"]["weight_versions"] == [vs[0], vs[1]]
    assert "2 version(s) behind" in res["error"]["message"]
    assert len(backend.double.requests) == 2


def test_continue_policy_keeps_going_and_records_every_version(start_server, backend):
    server = versioned_server(start_server, backend, 1, max_staleness=0)
    backend.double.push(ScriptedReply(text="one", delay_s=0.5), ScriptedReply(text="two", delay_s=0.5), "DONE")
    submit(server, "j", stale_policy="continue")
    completions_sent(backend, 1)
    bump(server, 2)
    completions_sent(backend, 2)
    bump(server, 3)

    res = result(server, "j")
    assert res["status"] == "completed" and res["reward"] == 1.0, res
    assert versions(res) == [1, 2, 3] and res["trajectory"]["weight_versions"] == [1, 2, 3]


def test_the_job_settings_win_over_the_server_settings(start_server, backend):
    server = versioned_server(start_server, backend, 1, max_staleness=0, stale_policy="continue")
    backend.double.push(ScriptedReply(text="one", delay_s=0.5), "unused")
    submit(server, "strict", stale_policy="end")  # the server's max_staleness 0, the job's policy
    completions_sent(backend, 1)
    bump(server, 2)
    res = result(server, "strict")
    assert res["status"] == "stale" and versions(res) == [1], res

    backend.double.replies.clear()
    backend.double.push(ScriptedReply(text="x", delay_s=0.5), "DONE")
    submit(server, "loose", max_staleness=1, stale_policy="end")  # one version behind is allowed
    completions_sent(backend, 2)
    bump(server, 3)
    res = result(server, "loose")
    assert res["status"] == "completed" and versions(res) == [2, 3], res


def test_an_aborted_turn_is_checked_again_when_resent(start_server, backend):
    """The check runs at dispatch, after the gate: a turn aborted by the update and resent is stale."""
    server = versioned_server(start_server, backend, 1, max_staleness=0, llm_failure_threshold=1)
    backend.double.push("one", ScriptedReply(text="slow", delay_s=10), "DONE")
    submit(server, "j")
    completions_sent(backend, 2)
    started = time.monotonic()
    bump(server, 2, mode="abort")
    assert time.monotonic() - started < 5

    res = result(server, "j")
    assert res["status"] == "stale" and versions(res) == [1], res
    wait_for(lambda: backend.double.requests[1].outcome == "aborted", 5, "the engine saw the request closed")
    assert len(backend.double.requests) == 2  # not resent
    info = server.http.get("/llm_servers").json()["servers"][0]
    assert info["circuit"] == "closed" and info["consecutive_failures"] == 0  # staleness is no backend failure


class SwallowingHandler(AgentHandler):
    """Catches every LLM error and returns normally, as a forgiving agent loop might."""

    name = "swallowing"

    async def run(self, ctx: JobContext) -> None:
        await ctx.llm.start([{"role": "user", "content": "q"}])
        for turn in range(3):
            try:
                await ctx.llm.generate()
            except StaleRollout:
                ctx.artifacts["swallowed"] = True
                return
            await ctx.llm.add_messages([{"role": "user", "content": f"observation {turn}"}])

    async def eval(self, ctx: JobContext) -> float:
        return 1.0


def test_a_handler_that_swallows_the_error_still_ends_stale(start_server, backend):
    server = start_server([], handlers={"swallowing": SwallowingHandler()}, max_staleness=0)
    assert server.http.post("/add_llm_server", json={"address": backend.address, "weight_version": 1}).is_success
    backend.double.push(ScriptedReply(text="one", delay_s=0.5))
    response = server.http.post("/jobs", json={"instance": {"data_source": "swallowing"}, "job_id": "j"})
    assert response.status_code == 202
    completions_sent(backend, 1)
    bump(server, 2)
    res = result(server, "j")
    assert res["status"] == "stale" and res["reward"] is None, res
    assert res["artifacts"] == {"swallowed": True}


def test_without_a_bound_jobs_span_versions(start_server, backend):
    server = versioned_server(start_server, backend, 1)
    backend.double.push(ScriptedReply(text="one", delay_s=0.5), "DONE")
    submit(server, "j")
    completions_sent(backend, 1)
    bump(server, 5)
    res = result(server, "j")
    assert res["status"] == "completed" and res["trajectory"]["weight_versions"] == [1, 5], res


def test_bad_values_are_422(server):
    for extra in (
        {"max_staleness": -1},
        {"max_staleness": 1.5},
        {"max_staleness": "1"},
        {"max_staleness": True},
        {"max_staleness": 2**63},
        {"stale_policy": "later"},
        {"stale_policy": 1},
    ):
        response = server.http.post("/jobs", json={**JOB, **extra})
        assert response.status_code == 422, (extra, response.text)
        assert response.json()["detail"][0]["loc"][:2] == ["body", next(iter(extra))], response.text
    ok = server.http.post("/jobs", json={**JOB, "max_staleness": 0, "stale_policy": "continue"})
    assert ok.status_code == 202, ok.text


def test_settings_and_cli():
    assert ServerSettings().max_staleness is None and ServerSettings().stale_policy == "end"
    with pytest.raises(ValidationError):
        ServerSettings(max_staleness=-1)
    with pytest.raises(ValidationError):
        ServerSettings(stale_policy="sometimes")
    parser = build_parser()
    settings = settings_from_args(parser.parse_args(["serve", "--max-staleness", "2", "--stale-policy", "continue"]))
    assert (settings.max_staleness, settings.stale_policy) == (2, "continue")
    settings = settings_from_args(parser.parse_args(["serve"]))
    assert (settings.max_staleness, settings.stale_policy) == (None, "end")
    for bad in (["--max-staleness", "-1"], ["--max-staleness", "x"], ["--stale-policy", "never"]):
        with pytest.raises(SystemExit):
            parser.parse_args(["serve", *bad])
    assert JobStatus.STALE in TERMINAL_STATUSES


def test_a_group_passes_its_staleness_settings_to_every_member(start_server, backend):
    server = versioned_server(start_server, backend, 1)  # the server has no bound
    backend.double.push(*(ScriptedReply(text="first turn", delay_s=0.5) for _ in range(2)), "unused", "unused")
    body = {"instance": JOB["instance"], "n": 2, "max_staleness": 0, "stale_policy": "end", "group_id": "strict"}
    assert server.http.post("/groups", params={"wait": "false"}, json=body).status_code == 202
    completions_sent(backend, 2)
    bump(server, 2)
    group = server.http.get("/groups/strict", params={"wait": 30}).json()
    assert group["status"] == "failed" and group["usable"] == 0, group
    assert [m["status"] for m in group["members"]] == ["stale", "stale"]
    assert server.http.post("/groups", json={**body, "group_id": "bad", "max_staleness": -1}).status_code == 422

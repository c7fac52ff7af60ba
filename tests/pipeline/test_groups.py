"""Groups: redundant rollouts of one instance, `n` selected (first_n, dual_end), the rest cancelled."""

from __future__ import annotations

import time

from prorl_server.pipeline.groups import select
from prorl_server.pipeline.redundancy import LengthHistory
from prorl_server.protocol import JobResult, JobStatus, MemberRole, Selection, Trajectory, TurnRecord
from prorl_server.testing import ScriptedReply

QUESTION = {"data_source": "multiturn", "question": "q"}


def wait_until(predicate, timeout: float = 10.0, interval: float = 0.02) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(interval)


def live_jobs(server) -> dict[str, int]:
    jobs = server.http.get("/status").json()["jobs"]
    return {status: count for status, count in jobs.items() if status != "stored_results" and count}


def by_index(group: dict) -> list[dict]:
    members = group["members"]
    assert [m["index"] for m in members] == list(range(len(members)))
    return members


def test_first_n_answers_after_n_usable_and_cancels_the_rest(server, backend):
    # two members get quick answers, two get answers that would take 30s
    backend.double.push(*(ScriptedReply(text="DONE fast", delay_s=1.0) for _ in range(2)))
    backend.double.push(*(ScriptedReply(text="DONE slow", delay_s=30) for _ in range(2)))
    started = time.monotonic()
    response = server.http.post("/groups", json={"instance": QUESTION, "n": 2, "n_launch": 4, "group_id": "g1"})
    assert response.status_code == 200, response.text
    assert time.monotonic() - started < 10
    group = response.json()
    assert group["status"] == "completed" and group["usable"] == 2 and not group["partial"]
    assert (group["n"], group["n_launch"], group["min_usable"], group["selection"]) == (2, 4, 2, "first_n")
    members = by_index(group)
    assert [m["job_id"] for m in members] == [f"g1:{i}" for i in range(4)]
    selected = [m for m in members if m["selected"]]
    others = [m for m in members if not m["selected"]]
    assert len(selected) == 2 and all(m["status"] == "completed" and m["role"] == "first" for m in selected)
    assert all(m["reward"] == 1.0 and m["response_length"] > 0 for m in selected)
    assert len(others) == 2 and all(m["status"] == "cancelled" and m["role"] is None for m in others)
    assert [r["job_id"] for r in group["results"]] == [m["job_id"] for m in selected]
    assert all(r["status"] == "completed" and r["artifacts"]["answer"] == "DONE fast" for r in group["results"])

    # the slow members' LLM requests were closed at once, and no job stays live
    wait_until(lambda: sorted(r.outcome for r in backend.double.requests) == ["aborted", "aborted", "done", "done"])
    wait_until(lambda: live_jobs(server) == {})
    assert server.state.backends.backends()[0].in_flight == 0
    for member in others:
        result = server.http.post("/cancel", json={"job_id": member["job_id"]}).json()
        assert result["status"] == "cancelled"
        assert server.http.get(f"/jobs/{member['job_id']}").json()["status"] == "cancelled"  # ids work in paths

    # every member is an ordinary job, streamed by GET /jobs with its result
    listed = {r["job_id"]: r for r in server.http.get("/jobs").json()["results"]}
    assert set(listed) == {f"g1:{i}" for i in range(4)}
    for member in others:
        error = listed[member["job_id"]]["error"]
        assert error["type"] == "Cancelled" and "g1" in error["message"] and "usable" in error["message"]

    # GET after the end gives the same decided group
    again = server.http.get("/groups/g1").json()
    assert again == group


def test_failed_member_never_blocks_the_group(server, backend):
    backend.double.push(ScriptedReply(text="bad", status_code=400))
    backend.double.push(*(ScriptedReply(text="DONE", delay_s=0.3) for _ in range(2)))
    group = server.http.post("/groups", json={"instance": QUESTION, "n": 2, "n_launch": 3}).json()
    assert group["status"] == "completed" and group["usable"] == 2 and not group["partial"]
    statuses = sorted(m["status"] for m in group["members"])
    assert statuses == ["completed", "completed", "failed"]
    failed = next(m for m in group["members"] if m["status"] == "failed")
    assert not failed["selected"] and failed["job_id"] not in [r["job_id"] for r in group["results"]]
    assert len(group["group_id"]) > 0 and all(m["job_id"].startswith(group["group_id"] + ":") for m in group["members"])


def test_group_that_cannot_reach_min_usable_fails_with_every_member_listed(server, backend):
    backend.double.push(*(ScriptedReply(text="bad", status_code=400) for _ in range(3)))
    backend.double.push(ScriptedReply(text="DONE", delay_s=0.2))
    body = {"instance": QUESTION, "n": 3, "n_launch": 4, "min_usable": 2, "group_id": "doomed"}
    group = server.http.post("/groups", json=body).json()
    assert group["status"] == "failed" and group["partial"] and group["usable"] == 1 and group["min_usable"] == 2
    members = by_index(group)
    assert sorted(m["status"] for m in members) == ["completed", "failed", "failed", "failed"]
    assert [m["selected"] for m in members].count(True) == 1
    assert [r["status"] for r in group["results"]] == ["completed"]

    # with min_usable 1 the same outcome completes, still partial
    backend.double.push(*(ScriptedReply(text="bad", status_code=400) for _ in range(3)))
    backend.double.push(ScriptedReply(text="DONE", delay_s=0.2))
    body = {"instance": QUESTION, "n": 3, "n_launch": 4, "min_usable": 1}
    group = server.http.post("/groups", json=body).json()
    assert group["status"] == "completed" and group["partial"] and len(group["results"]) == 1


def test_dual_end_keeps_shortest_and_longest_never_a_truncated_one(server, backend):
    pads = [1, 5, 9, 20, 40]
    backend.double.push(*(ScriptedReply(text="DONE" + "x" * k, delay_s=0.1 * (i % 3)) for i, k in enumerate(pads)))
    backend.double.push(ScriptedReply(text="DONE" + "y" * 80, finish_reason="length", delay_s=0.5))
    body = {"instance": QUESTION, "n": 3, "n_launch": 6, "selection": "dual_end", "group_id": "darts"}
    group = server.http.post("/groups", json=body).json()
    assert group["status"] == "completed" and group["usable"] == 6 and not group["partial"]
    members = by_index(group)
    assert all(m["status"] == "completed" for m in members)  # dual_end lets every member finish
    lengths = sorted(m["response_length"] for m in members)
    assert len(set(lengths)) == 6
    truncated = [m for m in members if m["truncated"]]
    assert len(truncated) == 1 and truncated[0]["response_length"] == lengths[-1]  # the longest of all
    assert not truncated[0]["selected"]

    chosen = [(m["response_length"], m["role"]) for m in members if m["selected"]]
    assert sorted(chosen) == [(lengths[0], "short"), (lengths[1], "short"), (lengths[-2], "long")]
    # results in the order selected: shortest first, then the longest
    assert [len(r["trajectory"]["response_ids"]) for r in group["results"]] == [lengths[0], lengths[1], lengths[-2]]


def test_dual_end_selection_rules():
    def result(length: int, *, truncated: bool = False, status: JobStatus = JobStatus.COMPLETED) -> JobResult:
        turn = TurnRecord(
            backend="b", finish_reason="length" if truncated else "stop", prompt_len=1, output_ids=[], logprobs=[]
        )
        return JobResult(job_id="j", status=status, trajectory=Trajectory(response_ids=[0] * length, turns=[turn]))

    finished = [
        (0, result(50)),
        (1, result(10)),
        (2, result(99, truncated=True)),
        (3, result(5, status=JobStatus.FAILED)),
        (4, result(20)),
        (5, result(98, truncated=True)),
    ]
    assert select(Selection.FIRST_N, 2, finished) == [(0, MemberRole.FIRST), (1, MemberRole.FIRST)]
    # n=4: K=2 shortest (10, 20), L=2 longest not truncated: only 50; the free slot goes to the next shortest
    assert select(Selection.DUAL_END, 4, finished) == [
        (1, MemberRole.SHORT),
        (4, MemberRole.SHORT),
        (5, MemberRole.SHORT),
        (0, MemberRole.LONG),
    ]
    # fewer usable than n: all of them, failed ones never
    assert {i for i, _ in select(Selection.DUAL_END, 8, finished)} == {0, 1, 2, 4, 5}


def test_bad_group_requests_are_4xx(server, backend):
    bad = [
        {"instance": QUESTION, "n": 0},
        {"instance": QUESTION, "n": 3, "n_launch": 2},
        {"instance": QUESTION, "n": 2, "selection": "best"},
        {"instance": QUESTION, "n": 2, "min_usable": 3},
        {"instance": QUESTION, "n": 2, "group_id": "a/b"},
        {"instance": QUESTION, "n": 2, "group_id": "a:b"},
        {"instance": QUESTION, "n": 2, "n_launch": 100_000},
        {"instance": QUESTION, "n": 2, "surprise": 1},
        {"n": 2},
        {"instance": QUESTION, "n": 2, "n_launch": 3, "adaptive": {}},
        {"instance": QUESTION, "n": 3, "adaptive": {"max_launch": 2}},
        {"instance": QUESTION, "n": 2, "adaptive": {"redundancy": 0.5}},
        {"instance": QUESTION, "n": 2, "adaptive": {"surprise": 1}},
    ]
    for body in bad:
        response = server.http.post("/groups", json=body)
        assert response.status_code == 422, (body, response.text)
    assert server.http.post("/groups", content=b"{not json").status_code == 422
    no_source = server.http.post("/groups", json={"instance": {"question": "q"}, "n": 2})
    assert no_source.status_code == 400 and "data_source" in no_source.text
    assert server.http.get("/groups/nope").status_code == 404
    assert server.http.delete("/groups/nope").status_code == 404
    assert live_jobs(server) == {} and backend.double.requests == []
    post = server.http.get("/openapi.json").json()["paths"]["/groups"]["post"]
    assert {"200", "202", "422"} <= set(post["responses"]) and "wait" in [p["name"] for p in post["parameters"]]
    assert "n_launch" in post["requestBody"]["content"]["application/json"]["schema"]["properties"]


def test_duplicate_group_id_same_request_is_the_same_group_different_is_409(server, backend):
    backend.double.push("DONE")
    body = {"instance": QUESTION, "n": 1, "group_id": "dup"}
    first = server.http.post("/groups", json=body)
    assert first.status_code == 200 and first.json()["status"] == "completed"
    again = server.http.post("/groups", json=body)
    assert again.status_code == 200 and again.json() == first.json()
    assert len(backend.double.requests) == 1  # no second launch
    conflict = server.http.post("/groups", json={**body, "n_launch": 2})
    assert conflict.status_code == 409 and "dup" in conflict.json()["detail"]


def test_member_id_taken_by_another_job_is_409_and_cancels_the_started_members(server, backend):
    backend.double.push(ScriptedReply(text="DONE", delay_s=30))
    assert server.http.post("/jobs", json={"instance": {"data_source": "noop"}, "job_id": "g9:1"}).status_code == 202
    response = server.http.post("/groups", json={"instance": QUESTION, "n": 2, "group_id": "g9"})
    assert response.status_code == 409 and "g9:1" in response.json()["detail"]
    wait_until(lambda: live_jobs(server) == {})
    assert server.http.post("/cancel", json={"job_id": "g9:0"}).json()["status"] == "cancelled"
    assert server.http.get("/groups/g9").status_code == 404


def test_get_group_while_running_and_after(server, backend):
    backend.double.push(*(ScriptedReply(text="DONE", delay_s=1.0) for _ in range(2)))
    accepted = server.http.post("/groups?wait=false", json={"instance": QUESTION, "n": 2, "group_id": "bg"})
    assert accepted.status_code == 202
    assert accepted.json() == {"group_id": "bg", "job_ids": ["bg:0", "bg:1"]}
    running = server.http.get("/groups/bg").json()
    assert running["status"] == "running" and running["results"] == [] and not running["partial"]
    assert all(m["status"] in ("queued", "init", "run", "eval") and not m["selected"] for m in running["members"])
    done = server.http.get("/groups/bg", params={"wait": 10}).json()
    assert done["status"] == "completed" and [r["job_id"] for r in done["results"]] in (
        ["bg:0", "bg:1"],
        ["bg:1", "bg:0"],
    )
    assert server.http.get("/groups/bg", params={"wait": -1}).status_code == 422


def test_delete_group_cancels_its_members(server, backend):
    backend.double.push(*(ScriptedReply(text="DONE", delay_s=30) for _ in range(3)))
    server.http.post("/groups?wait=false", json={"instance": QUESTION, "n": 2, "n_launch": 3, "group_id": "gone"})
    wait_until(lambda: len(backend.double.requests) == 3)
    started = time.monotonic()
    group = server.http.delete("/groups/gone").json()
    assert time.monotonic() - started < 5
    assert group["status"] == "failed" and group["usable"] == 0 and group["results"] == []
    assert [m["status"] for m in group["members"]] == ["cancelled"] * 3
    wait_until(lambda: [r.outcome for r in backend.double.requests] == ["aborted"] * 3)
    assert server.http.delete("/groups/gone").json() == group  # idempotent


def darts_greedy(weights: list[float], n: int, total: int, upper: int) -> list[int]:
    """DARTS' Algorithm 1 as the paper writes it (the reference the server's closed form is checked against)."""
    budget = [n] * len(weights)
    for _ in range(total - n * len(weights)):
        gains = [w * (1 / m - 1 / (m + 1)) if m < upper else -1.0 for w, m in zip(weights, budget, strict=True)]
        budget[gains.index(max(gains))] += 1
    return budget


def test_adaptive_budget_follows_dartss_allocation():
    history = LengthHistory()
    assert history.budget("new", 4, 1.5, 8) == 6  # nothing known: n * redundancy
    spreads = {"flat": [10, 10, 10], "a": [10, 20, 30], "b": [10, 50, 90], "c": [10, 110, 210], "wild": [5, 400, 800]}
    for key, lengths in spreads.items():
        history.record(key, lengths)
    budgets = {key: history.budget(key, 4, 1.5, 100) for key in spreads}
    assert budgets["flat"] == 4  # the least spread: the lower bound
    assert list(budgets.values()) == sorted(budgets.values()) and budgets["wild"] == 12  # more spread, more members
    weights = [history.spread(k) / history.spread("wild") for k in spreads]  # min-max: flat's spread is 0
    reference = darts_greedy(weights, 4, sum(budgets.values()), 100)
    assert all(abs(ours - ref) <= 1 for ours, ref in zip(budgets.values(), reference, strict=True)), (
        budgets,
        reference,
    )
    assert history.budget("wild", 4, 1.5, 8) == 8  # clipped to max_launch
    assert history.budget("unseen", 4, 1.5, 8) == 6

    history.record("flat", [10, 1010])  # the moving average: half the old spread, half the new one
    assert history.spread("flat") == 250.0
    history.record("flat", [7])  # one length has no spread: ignored
    assert history.spread("flat") == 250.0


def test_length_history_forgets_the_least_recently_seen_prompts():
    history = LengthHistory(max_prompts=2)
    for key in ("a", "b", "c"):
        history.record(key, [1, 3])
    assert history.spread("a") is None and len(history) == 2
    history.record("b", [1, 5])
    history.record("d", [1, 3])
    assert history.spread("c") is None and history.spread("b") is not None


def test_adaptive_groups_size_by_their_prompts_length_spread_and_tail_prune_at_the_cap(server, backend):
    varied = {"data_source": "multiturn", "question": "varied"}
    steady = {"data_source": "multiturn", "question": "steady"}
    adaptive = {"max_launch": 4}  # n = 2: a new prompt gets 3 members, the most spread prompt 4, the least 2

    backend.double.push(*(ScriptedReply(text="DONE" + "x" * k) for k in (1, 40, 80)))
    first = server.http.post("/groups", json={"instance": varied, "n": 2, "adaptive": adaptive}).json()
    backend.double.push(*(ScriptedReply(text="DONE same") for _ in range(3)))
    other = server.http.post("/groups", json={"instance": steady, "n": 2, "adaptive": adaptive}).json()
    assert (first["n_launch"], other["n_launch"]) == (3, 3) and not first["tail_pruned"]

    # the varied prompt is now the most spread: 4 members, its cap, so dual_end is tail-pruned
    backend.double.push(*(ScriptedReply(text="DONE fast", delay_s=0.2) for _ in range(2)))
    backend.double.push(*(ScriptedReply(text="DONE slow", delay_s=30) for _ in range(2)))
    started = time.monotonic()
    body = {"instance": varied, "n": 2, "adaptive": adaptive, "selection": "dual_end", "group_id": "pruned"}
    group = server.http.post("/groups", json=body).json()
    assert time.monotonic() - started < 10  # it did not wait for the slow members
    assert group["n_launch"] == 4 and group["tail_pruned"] and group["status"] == "completed"
    assert sorted(m["status"] for m in group["members"]) == ["cancelled", "cancelled", "completed", "completed"]
    assert [r["artifacts"]["answer"] for r in group["results"]] == ["DONE fast", "DONE fast"]
    wait_until(lambda: live_jobs(server) == {})

    # the steady prompt is the least spread: n members, and a dual_end group below its cap runs them all
    backend.double.push(*(ScriptedReply(text="DONE same") for _ in range(2)))
    body = {"instance": steady, "n": 2, "adaptive": adaptive, "selection": "dual_end"}
    group = server.http.post("/groups", json=body).json()
    assert group["n_launch"] == 2 and not group["tail_pruned"] and group["usable"] == 2

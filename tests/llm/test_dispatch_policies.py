"""Priority dispatch: the per-backend admission gate, its dispatch policies, and per-trajectory telemetry.

With `max_inflight_per_backend=1` one completion runs at a time, so the order of the requests the scripted
backend records is the order the gate admitted them in. A "holder" job keeps the slot (a 30 s reply) while the
others queue; cancelling it hands the slot on.
"""

from __future__ import annotations

import asyncio
import threading

import pytest
import server_jobs
from handlers_for_tests import GatedHandler
from polling import wait_for
from pydantic import ValidationError

from prorl_server.cli import build_parser
from prorl_server.config import DispatchPolicyName, PredictorName, ServerSettings
from prorl_server.llm.admission import AdmissionGate, SlotState
from prorl_server.scheduling import PREDICTORS
from prorl_server.scheduling.dispatch import DISPATCH_POLICIES
from prorl_server.testing import ScriptedReply

HOLD = ScriptedReply(text="hold", delay_s=30)


def start(start_server, backend, **settings):
    handler = GatedHandler()
    settings.setdefault("max_inflight_per_backend", 1)
    server = start_server([backend.address], handlers={"gated": handler}, **settings)
    return server, handler


def submit(server, job_id: str, question: str = "q", turns: int = 1, **extra) -> None:
    body = {"instance": {"data_source": "gated", "question": question, **extra.pop("instance", {})}}
    body.update(job_id=job_id, agent_config={"max_turns": turns}, **extra)
    response = server.http.post("/jobs", json=body)
    assert response.status_code == 202, response.text


def result(server, job_id: str) -> dict:
    return server_jobs.result(server, job_id, timeout=30)


def scheduling(server) -> dict:
    return server.http.get("/status").json()["scheduling"]


def wait_waiting(server, count: int) -> None:
    wait_for(lambda: scheduling(server)["waiting_calls"] == count, 20, f"{count} calls wait at the gate")


def hold_slot(server, backend) -> None:
    """Job "H" takes the only slot and keeps it until cancelled."""
    backend.double.push(HOLD, job="H")
    submit(server, "H", question="hold")
    wait_for(lambda: any(r.job_id == "H" for r in backend.double.requests), 20, "the holder's call runs")


def release_slot(server) -> None:
    assert server.http.post("/cancel", json={"job_id": "H"}).json()["status"] == "cancelled"


def order_after_holder(backend) -> list[str | None]:
    jobs = [r.job_id for r in backend.double.requests]
    return jobs[jobs.index("H") + 1 :]


@pytest.mark.parametrize(("policy", "expected"), [("fcfs", ["A", "C"]), ("round_robin", ["C", "A"])])
def test_fcfs_keeps_trajectory_order_and_round_robin_queues_the_next_turn_last(start_server, backend, policy, expected):
    """A is older than C, but its second turn queues after C's first: fcfs serves A first, round_robin C."""
    server, handler = start(start_server, backend, dispatch_policy=policy, vllm_priority=True)
    handler.proceed["A"] = threading.Event()
    submit(server, "A", turns=2)
    wait_for(lambda: any(r.job_id == "A" for r in backend.double.requests), 20, "A's first turn runs")
    hold_slot(server, backend)
    submit(server, "C")
    wait_waiting(server, 1)
    handler.proceed["A"].set()
    wait_waiting(server, 2)
    release_slot(server)
    assert result(server, "A")["status"] == result(server, "C")["status"] == "completed"
    assert order_after_holder(backend) == expected
    sent = [r.params.get("priority") for r in backend.double.requests]
    if policy == "fcfs":
        assert sent == [None] * len(sent)  # fcfs is vLLM's own order: nothing is sent
    else:  # each call's own arrival number: increasing in the order they were admitted
        assert sent == sorted(sent) and None not in sent
    status = scheduling(server)
    assert status["dispatch_policy"] == policy and status["max_inflight_per_backend"] == 1
    assert status["predictor"] == "online" and status["placement"] == "sticky_least_loaded"
    assert status["waiting_calls"] == status["admitted_calls"] == 0


def train(server, backend) -> None:
    """Finish two jobs of a long and two of a short prompt, so the predictor tells them apart."""
    for i in range(2):
        backend.double.push(ScriptedReply(text="word " * 200), job=f"long-{i}")
        backend.double.push(ScriptedReply(text="ok"), job=f"short-{i}")
        submit(server, f"long-{i}", question="the long task")
        submit(server, f"short-{i}", question="the short task")
        assert result(server, f"long-{i}")["status"] == result(server, f"short-{i}")["status"] == "completed"


@pytest.mark.parametrize(("policy", "first", "second"), [("progressive", "L", "S"), ("srpt", "S", "L")])
def test_predicted_remaining_orders_the_waiting_calls_and_their_vllm_priority(
    start_server, backend, policy, first, second
):
    """Trained on finished jobs, progressive admits the long prompt's call first and srpt the short one's,
    each ahead of a call that arrived earlier; the priority sent to vLLM is lower for the one admitted first."""
    server, _ = start(start_server, backend, dispatch_policy=policy, vllm_priority=True)
    train(server, backend)
    hold_slot(server, backend)
    questions = {"L": "the long task", "S": "the short task"}
    submit(server, second, question=questions[second])  # arrives first, yet goes second
    wait_waiting(server, 1)
    submit(server, first, question=questions[first], sampling_params={"temperature": 0.5})
    wait_waiting(server, 2)
    release_slot(server)
    assert result(server, first)["status"] == result(server, second)["status"] == "completed"
    assert order_after_holder(backend) == [first, second]
    sent = {r.job_id: r.params["priority"] for r in backend.double.requests}
    assert sent[first] < sent[second]


def test_a_priority_in_the_trainers_sampling_params_is_sent_as_it_is(start_server, backend):
    server, _ = start(start_server, backend, dispatch_policy="srpt", vllm_priority=True)
    submit(server, "own", sampling_params={"priority": 7})
    assert result(server, "own")["status"] == "completed"
    assert backend.double.requests[-1].params["priority"] == 7


def test_cancelled_and_timed_out_waiters_leave_the_gate(start_server, backend):
    server, _ = start(start_server, backend, dispatch_policy="progressive")
    hold_slot(server, backend)
    submit(server, "cancelled")
    wait_waiting(server, 1)
    server.http.post("/cancel", json={"job_id": "cancelled"})
    wait_waiting(server, 0)
    submit(server, "impatient", timeout=0.5)
    wait_waiting(server, 1)
    timed_out = result(server, "impatient")
    assert timed_out["status"] == "timeout"
    wait_waiting(server, 0)
    submit(server, "next")
    wait_waiting(server, 1)
    release_slot(server)  # the slot goes to the one waiter left
    assert result(server, "next")["status"] == "completed"
    assert result(server, "cancelled")["status"] == "cancelled"
    assert [r.job_id for r in backend.double.requests] == ["H", "next"]  # the others never reached the backend
    status = scheduling(server)
    assert status["waiting_calls"] == status["admitted_calls"] == 0


def test_a_weight_update_abort_empties_the_gate_and_the_calls_are_resent(start_server, backend):
    server, _ = start(start_server, backend)
    hold_slot(server, backend)
    submit(server, "W")
    wait_waiting(server, 1)
    body = server.http.post("/weights/pause", json={"mode": "abort"}).json()
    assert body["aborted"] == 2  # the holder's call in flight and W's call waiting for its slot
    wait_for(lambda: scheduling(server)["waiting_calls"] == 0, 20, "W's call left the gate")
    wait_for(lambda: scheduling(server)["admitted_calls"] == 0, 20, "the holder's slot is free")
    assert server.http.post("/weights/resume").status_code == 200
    assert result(server, "H")["status"] == result(server, "W")["status"] == "completed"
    assert sorted(r.job_id for r in backend.double.requests) == ["H", "H", "W"]


def test_a_failed_backend_call_frees_its_slot(start_server, backend):
    server, _ = start(start_server, backend, llm_max_failovers=0, llm_retry_budget_s=0)
    backend.double.push(ScriptedReply(status_code=500), job="broken")
    submit(server, "broken")
    assert result(server, "broken")["status"] == "failed"
    submit(server, "after")
    assert result(server, "after")["status"] == "completed"
    assert scheduling(server)["admitted_calls"] == 0


def test_telemetry_counts_turns_llm_queue_and_tool_time(start_server, backend):
    server, _ = start(start_server, backend)
    hold_slot(server, backend)
    backend.double.push(ScriptedReply(text="a", delay_s=0.05), ScriptedReply(text="b", delay_s=0.05), job="T")
    submit(server, "T", turns=2, instance={"tool_s": 0.2})
    wait_waiting(server, 1)
    release_slot(server)
    res = result(server, "T")
    assert res["status"] == "completed"
    timing, turns = res["timing"], res["trajectory"]["turns"]
    assert timing["turns"] == len(turns) == 2
    assert turns[0]["queue_s"] > 0 and timing["llm_queue_s"] == pytest.approx(sum(t["queue_s"] for t in turns))
    assert all(t["llm_s"] > 0 for t in turns)
    assert timing["llm_s"] == pytest.approx(sum(t["llm_s"] for t in turns))
    assert timing["tool_s"] > 0
    assert timing["llm_s"] + timing["llm_queue_s"] + timing["tool_s"] <= timing["run_s"] + 0.05


def test_without_a_limit_nothing_waits_and_no_priority_is_sent(server, backend):
    """The defaults are today's behaviour: no admission gate, fcfs, nothing added to the request."""
    response = server.http.post(
        "/jobs", json={"instance": {"data_source": "multiturn", "question": "q"}, "job_id": "plain"}
    )
    assert response.status_code == 202
    wait_for(lambda: server.http.get("/jobs/plain").json()["result"] is not None, 20, "the job finished")
    assert all("priority" not in r.params for r in backend.double.requests)
    status = scheduling(server)
    assert status == {
        "dispatch_policy": "fcfs",
        "predictor": "online",
        "placement": "sticky_least_loaded",
        "max_inflight_per_backend": None,
        "vllm_priority": False,
        "waiting_calls": 0,
        "admitted_calls": 0,
    }


def test_bad_policy_names_fail_at_start(capsys):
    for argv in (["--dispatch-policy", "lifo"], ["--predictor", "oracle"], ["--max-inflight-per-backend", "0"]):
        with pytest.raises(SystemExit):
            build_parser().parse_args(["serve", *argv])
        assert argv[0] in capsys.readouterr().err
    with pytest.raises(ValidationError):
        ServerSettings(dispatch_policy="lifo")
    assert set(DispatchPolicyName.__args__) == set(DISPATCH_POLICIES)
    assert set(PredictorName.__args__) == set(PREDICTORS)


def test_admission_gate_orders_waiters_and_hands_on_slots_of_cancelled_ones():
    async def scenario() -> list[int]:
        gate = AdmissionGate(1)
        first = await gate.admit(0)
        admitted: list[int] = []

        async def call(priority: int) -> None:
            slot = await gate.admit(priority)
            admitted.append(priority)
            gate.release(slot)

        tasks = {p: asyncio.ensure_future(call(p)) for p in (5, 1, 3)}
        while gate.waiting < 3:
            await asyncio.sleep(0)
        tasks[1].cancel()  # leaves the gate: the slot goes to the next in order
        while gate.waiting > 2:
            await asyncio.sleep(0)
        gate.release(first)
        gate.release(first)  # idempotent
        await asyncio.gather(tasks[5], tasks[3])
        assert first.state is SlotState.RELEASED and gate.admitted == gate.waiting == 0
        return admitted

    assert asyncio.run(scenario()) == [3, 5]

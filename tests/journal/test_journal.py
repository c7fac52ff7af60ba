"""The results journal: a server killed with kill -9 comes back with its unacknowledged results under their
cursors, fails (or re-queues) the jobs it had in flight, keeps acknowledgements and retention, refuses a
second server on the same journal, and refuses a corrupt journal with a clear message."""

from __future__ import annotations

import asyncio
import os
import signal
import sqlite3
import subprocess
import threading
import time
from pathlib import Path

import httpx
import pytest
from polling import wait_for
from repo_paths import TESTS
from serve_process import serve_executable, start_serve, stop

from prorl_server import AgentHandler, JobContext
from prorl_server.api import ServerState
from prorl_server.auth_key import auth_headers
from prorl_server.config import ServerSettings
from prorl_server.journal import RESTART_ERROR_TYPE, JournalError
from prorl_server.journal.database import Batch, open_database, write
from prorl_server.journal.recovery import recover
from prorl_server.protocol import JobResult, JobStatus, ProcessRequest
from prorl_server.testing.uvicorn_thread import free_port

JOB = {"instance": {"data_source": "multiturn", "question": "q"}}


def submit(http: httpx.Client, job_id: str, **extra) -> None:
    response = http.post("/jobs", json={**JOB, "job_id": job_id, **extra})
    assert response.status_code == 202, response.text


def finished(http: httpx.Client, job_id: str, timeout: float = 30.0) -> dict:
    found: dict = {}

    def done() -> bool:
        found["r"] = http.get(f"/jobs/{job_id}").json()["result"]
        return found["r"] is not None

    wait_for(done, timeout, f"job {job_id} finished")
    return found["r"]


def cursors(http: httpx.Client, after: int = 0) -> list[tuple[str, int]]:
    """(job id, cursor) of every stored result after `after`, in completion order."""
    out = []
    while True:
        page = http.get("/jobs", params={"after": after, "limit": 1}).json()
        if not page["results"]:
            return out
        after = page["next_cursor"]
        out.append((page["results"][0]["job_id"], after))


def children(pid: int) -> list[int]:
    """The processes whose parent is `pid`."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:  # it ended meanwhile
            continue
        if int(fields[1]) == pid:
            found.append(int(stat.parent.name))
    return found


def ended(pid: int) -> bool:
    """Whether process `pid` is gone (or a zombie: its work is over)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return True
    return state in ("Z", "X")


def rows(journal: Path, table: str) -> int:
    with sqlite3.connect(journal) as db:
        return db.execute(f"SELECT count(*) FROM {table}").fetchone()[0]


def test_kill_9_keeps_results_and_cursors_fails_in_flight_jobs_and_requeues_on_request(tmp_path, backend):
    journal = tmp_path / "journal.sqlite3"
    options = (
        "--journal", str(journal), "--llm-server", backend.address,
        "--handler", f"{TESTS / 'handlers_for_tests.py'}:MultiTurnChatHandler",
    )  # fmt: skip
    proc, url, _ = start_serve(tmp_path, None, *options)
    try:
        with httpx.Client(base_url=url, timeout=30, headers=auth_headers()) as http:
            for job_id in ("a", "b", "c"):
                submit(http, job_id)
            before = {job_id: finished(http, job_id) for job_id in ("a", "b", "c")}
            assert all(r["status"] == "completed" for r in before.values())
            order = cursors(http)
            assert http.post("/jobs/ack", json={"job_ids": ["a"]}).json() == {"acknowledged": 1}
            backend.double.default_delay_s = 60  # the next jobs stay in RUN, waiting for the model
            submit(http, "lost")
            submit(http, "again", requeue_on_restart=True)
            wait_for(lambda: sum(r.outcome == "running" for r in backend.double.requests) == 2, 20, "both jobs in RUN")
            (writer,) = children(proc.pid)  # the journal's writer process
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
    wait_for(lambda: ended(writer), 10, "the writer process ended with its server")
    backend.double.default_delay_s = 0

    proc, url, log = start_serve(tmp_path, None, *options)
    try:
        with httpx.Client(base_url=url, timeout=30, headers=auth_headers()) as http:
            assert http.get("/jobs/a").status_code == 404  # acknowledged before the crash: stays gone
            for job_id in ("b", "c"):
                assert http.get(f"/jobs/{job_id}").json()["result"] == before[job_id]
            last = order[-1][1]
            kept = [(job_id, cursor) for job_id, cursor in order if job_id != "a"]
            assert cursors(http)[:2] == kept  # the same results under the same cursors
            lost = finished(http, "lost")
            assert lost["status"] == "failed" and lost["error"]["type"] == RESTART_ERROR_TYPE
            assert "killed" in lost["error"]["message"] and "requeue_on_restart" in lost["error"]["message"]
            again = finished(http, "again")
            assert again["status"] == "completed" and again["trajectory"]["turns"], again
            after_restart = cursors(http, after=last)
            assert sorted(job_id for job_id, _ in after_restart) == ["again", "lost"]
            assert all(cursor > last for _, cursor in after_restart)  # cursors continue, they do not restart at 1
            submit(http, "b")  # the same request again: the stored result, not a second run
            assert http.get("/jobs/b").json()["result"] == before["b"]
            (writer,) = children(proc.pid)
    finally:
        stop(proc)
    assert proc.returncode in (0, -signal.SIGTERM)  # a graceful stop (SIGTERM), not a kill after the timeout
    assert ended(writer)  # the server waited for its writer process
    assert "Traceback" not in log.read_text()


def test_acknowledgements_and_retention_persist_across_a_restart(tmp_path, start_server, backend):
    journal = tmp_path / "journal.sqlite3"
    server = start_server([backend.address], journal=str(journal))
    for job_id in ("x", "y", "z"):
        submit(server.http, job_id)
        finished(server.http, job_id)
    order = cursors(server.http)
    assert server.http.post("/jobs/ack", json={"through": order[0][1]}).json() == {"acknowledged": 1}
    assert server.http.post("/jobs/ack", json={"job_ids": [order[1][0]]}).json() == {"acknowledged": 1}
    server.server.stop()

    server = start_server([backend.address], journal=str(journal))
    assert cursors(server.http) == order[2:]
    submit(server.http, "w")
    finished(server.http, "w")
    last = cursors(server.http)[-1]
    assert last[0] == "w" and last[1] > order[2][1]
    server.server.stop()
    assert rows(journal, "results") == 2 and rows(journal, "jobs") == 0
    assert {path.stat().st_mode & 0o777 for path in tmp_path.glob("journal.sqlite3*")} == {0o600}

    time.sleep(0.6)  # let both results pass a retention of 0.5 s
    server = start_server([backend.address], journal=str(journal), result_retention_s=0.5)
    assert cursors(server.http) == []
    assert rows(journal, "results") == 0  # expired rows are deleted, not only hidden
    server.server.stop()

    server = start_server([backend.address], journal=str(journal))  # nothing stored: cursors still continue
    submit(server.http, "v")
    finished(server.http, "v")
    assert cursors(server.http) == [("v", last[1] + 1)]


class PayloadHandler(AgentHandler):
    """Finishes at once with a 200 KB artifact: results that make the journal file grow."""

    name = "payload"

    async def run(self, ctx: JobContext) -> None:
        ctx.artifacts["payload"] = "x" * 200_000

    async def eval(self, ctx: JobContext) -> float:
        return 1.0


def journal_bytes(journal: Path) -> int:
    return sum(path.stat().st_size for path in journal.parent.glob(journal.name + "*") if path.exists())


def test_compaction_deletes_expired_results_and_shrinks_the_file_while_the_server_runs(tmp_path, start_server, backend):
    journal = tmp_path / "journal.sqlite3"
    server = start_server(
        [backend.address],
        handlers={"payload": PayloadHandler()},
        journal=str(journal),
        result_retention_s=1.0,
        journal_compact_interval_s=0.2,
    )
    for index in range(5):
        response = server.http.post("/process", json={"instance": {"data_source": "payload"}, "job_id": f"p{index}"})
        assert response.json()["status"] == "completed"
    assert rows(journal, "results") == 5  # /process answered: the results are committed
    assert journal_bytes(journal) > 1_000_000
    wait_for(lambda: rows(journal, "results") == 0, 20, "the expired results deleted by compaction")
    wait_for(lambda: journal_bytes(journal) < 200_000, 20, "the journal file shrunk")


def serve_once(journal: Path) -> subprocess.CompletedProcess[str]:
    """`prorl-server serve --journal JOURNAL` in a child process, expected to refuse to start."""
    return subprocess.run(
        [serve_executable(), "serve", "--port", str(free_port()), "--no-entry-points", "--journal", str(journal)],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_a_second_server_on_the_same_journal_refuses_to_start(tmp_path, start_server):
    journal = tmp_path / "journal.sqlite3"
    start_server(journal=str(journal))
    done = serve_once(journal)
    assert done.returncode == 1
    assert f"the journal {journal} is in use by another prorl-server (pid {os.getpid()}" in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize(
    ("content", "says"),
    [
        (b"this is not a database\n" * 200, "file is not a database"),
        (None, "not a prorl-server journal"),
    ],
)
def test_a_corrupt_or_foreign_journal_is_a_clear_start_up_error(tmp_path, content, says):
    journal = tmp_path / "journal.sqlite3"
    if content is None:
        with sqlite3.connect(journal) as db:
            db.execute("CREATE TABLE other (x)")
    else:
        journal.write_bytes(content)
    done = serve_once(journal)
    assert done.returncode == 1
    assert done.stderr.strip().splitlines()[-1].startswith("prorl-server: ") and says in done.stderr
    assert "Traceback" not in done.stderr


def test_a_journal_that_cannot_be_created_is_refused_and_its_lock_released(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    with pytest.raises(JournalError, match="cannot create the journal's lock file"):
        ServerState.build(ServerSettings(journal=str(blocker / "journal.sqlite3"), entry_point_handlers=False))
    journal = tmp_path / "journal.sqlite3"
    journal.write_bytes(b"garbage" * 1000)
    with pytest.raises(JournalError, match="move it"):
        ServerState.build(ServerSettings(journal=str(journal), entry_point_handlers=False))
    journal.unlink()  # moved aside: the same path now works (the failed attempt left no lock behind)
    state = ServerState.build(ServerSettings(journal=str(journal), entry_point_handlers=False))
    assert state.journal is not None
    state.journal.close()


def test_a_group_posted_again_after_a_restart_reuses_its_members_results(tmp_path, start_server, backend):
    journal = tmp_path / "journal.sqlite3"
    group = {**JOB, "n": 2, "group_id": "g"}
    server = start_server([backend.address], journal=str(journal))
    first = server.http.post("/groups", json=group).json()
    assert first["status"] == "completed"
    server.server.stop()
    calls = len(backend.double.requests)

    server = start_server([backend.address], journal=str(journal))
    assert server.http.get("/groups/g").status_code == 404  # groups themselves are not journaled
    again = server.http.post("/groups", json=group).json()

    def by_job(results: list[dict]) -> list[dict]:  # selection order: whichever stored result was seen first
        return sorted(results, key=lambda r: r["job_id"])

    assert again["status"] == "completed" and by_job(again["results"]) == by_job(first["results"])
    assert len(backend.double.requests) == calls  # no member ran again


def test_a_batch_larger_than_one_statement_is_written_whole(tmp_path):
    journal = tmp_path / "journal.sqlite3"
    db = open_database(journal)
    results = [JobResult(job_id=f"r{seq}", status=JobStatus.COMPLETED, reward=1.0) for seq in range(1, 401)]
    added = [(seq, r.job_id, "digest", r.model_dump_json(), time.time()) for seq, r in enumerate(results, 1)]
    write(db, Batch(jobs_done=[f"r{seq}" for seq in range(400)], results_added=added))
    write(db, Batch(results_removed=list(range(1, 401, 2))))
    recovered = recover(db, journal, retention_s=3600)
    db.close()
    assert [kept.seq for kept in recovered.results] == list(range(2, 401, 2))
    assert [kept.result for kept in recovered.results] == results[1::2]
    assert recovered.next_seq == 401 and recovered.in_flight == []


@pytest.fixture
def writer_on(tmp_path):
    """A JournalWriter on a fresh journal with its own writer process (commit interval as given); closed,
    and its lock released, after the test."""
    from prorl_server.journal.lock import JournalLock
    from prorl_server.journal.process import WriterProcess
    from prorl_server.journal.writer import JournalWriter

    made = []

    def make(commit_interval_s: float = 0.002) -> tuple[JournalWriter, WriterProcess, Path]:
        path = tmp_path / "journal.sqlite3"
        lock = JournalLock(path)
        open_database(path).close()
        assert lock.fd is not None
        process = WriterProcess(
            path, "normal", lock.fd, retention_s=3600.0, compact_interval_s=3600.0, commit_interval_s=commit_interval_s
        )
        writer = JournalWriter(process, path)
        made.append((writer, lock))
        return writer, process, path

    yield make
    for writer, lock in made:
        writer.close()
        lock.release()


def job(job_id: str, artifact: str = "") -> tuple[ProcessRequest, JobResult]:
    request = ProcessRequest.model_validate({**JOB, "job_id": job_id})
    result = JobResult(job_id=job_id, status=JobStatus.COMPLETED, reward=1.0, artifacts={"a": artifact})
    return request, result


def test_a_waiter_is_committed_at_once_when_every_job_in_flight_waits(writer_on):
    """The writer holds commits apart to batch them, but not when someone waits and no job is in flight (no
    result is coming that could share the commit). Shown with the interval set to a minute."""
    journal, _, path = writer_on(commit_interval_s=60.0)

    async def scenario() -> None:
        (req_a, res_a), (req_b, res_b) = job("a"), job("b")
        journal.admitted("a", "digest-a", req_a)
        journal.admitted("b", "digest-b", req_b)
        await journal.durable()  # a waiter on admissions alone: no result is coming to share the commit
        journal.stored(1, res_a, "digest-a")
        waiter = asyncio.ensure_future(journal.durable(admissions=False))
        await asyncio.sleep(0.5)
        assert not waiter.done(), "b is still in flight: the commit waits for the interval (a minute here)"
        journal.stored(2, res_b, "digest-b")  # b has finished too: nothing is in flight, committed at once
        await asyncio.wait_for(asyncio.shield(waiter), 10)

    asyncio.run(asyncio.wait_for(scenario(), 30))
    assert rows(path, "results") == 2 and rows(path, "jobs") == 0


def test_a_result_larger_than_the_socket_takes_is_committed_whole_and_in_order(writer_on):
    """Changes go out without blocking their thread: what the socket cannot take at once is sent by the
    sender thread as the writer process reads, in order (the acknowledgement after a 12 MB result, then
    a small result after both)."""
    journal, _, path = writer_on()
    big = "x" * (12 << 20)

    async def scenario() -> None:
        (req_a, res_a), (req_b, res_b) = job("a", big), job("b")
        journal.admitted("a", "d", req_a)
        journal.admitted("b", "d", req_b)
        journal.stored(1, res_a, "d")
        journal.removed([1])
        journal.stored(2, res_b, "d")
        await asyncio.wait_for(journal.durable(), 60)

    asyncio.run(scenario())
    with sqlite3.connect(path) as db:
        assert db.execute("SELECT seq FROM results").fetchall() == [(2,)]
        assert db.execute("SELECT count(*) FROM jobs").fetchone()[0] == 0


def test_a_killed_writer_process_releases_every_waiter_and_is_logged_once(writer_on, caplog):
    """kill -9 of the writer process: waiters return (the changes are kept in memory only, as without a
    journal), one ERROR says so, and later changes neither raise nor log again."""
    journal, process, _ = writer_on(commit_interval_s=60.0)

    async def scenario() -> None:
        (req_a, res_a), (req_b, _) = job("a"), job("b")
        journal.admitted("a", "d", req_a)
        journal.admitted("b", "d", req_b)
        journal.stored(1, res_a, "d")  # b is in flight: held for the interval (a minute)
        waiter = asyncio.ensure_future(journal.durable(admissions=False))
        await asyncio.sleep(0.2)
        assert not waiter.done()
        os.kill(process.pid, signal.SIGKILL)
        await asyncio.wait_for(waiter, 10)
        journal.removed([1])
        journal.stored(2, job("c", "x" * (12 << 20))[1], "d")  # more than the socket takes: nothing to send to
        await asyncio.wait_for(journal.durable(), 1)
        await asyncio.sleep(0.2)
        assert not process._sender.is_alive(), "the sender thread ends with the process (no spinning)"

    with caplog.at_level("ERROR", logger="prorl_server.journal.writer"):
        asyncio.run(scenario())
    gone = [r for r in caplog.records if "kept in memory only" in r.getMessage()]
    assert len(gone) == 1, caplog.text


def test_a_job_that_ends_within_the_interval_gets_no_in_flight_row(writer_on):
    """Admissions alone wait the interval (nobody waits for them): a job whose result comes meanwhile is
    written once, with its result. Shown with the interval at a minute: its in-flight row is never written."""
    journal, _, path = writer_on(commit_interval_s=60.0)

    async def scenario() -> None:
        (req_a, res_a), (req_b, _) = job("a"), job("b")
        journal.admitted("b", "d", req_b)
        await journal.durable()  # b's admission on disk; b stays in flight
        journal.admitted("a", "d", req_a)
        await asyncio.sleep(0.3)
        assert rows(path, "jobs") == 1, "a's admission is held, b's alone is on disk"
        journal.stored(1, res_a, "d")
        waiter = asyncio.ensure_future(journal.durable(admissions=False))
        await asyncio.sleep(0.3)
        assert not waiter.done() and rows(path, "jobs") == 1
        journal.close()  # closing commits everything sent
        await asyncio.wait_for(waiter, 10)

    asyncio.run(scenario())
    with sqlite3.connect(path) as db:
        assert db.execute("SELECT job_id FROM jobs").fetchall() == [("b",)]
        assert db.execute("SELECT job_id FROM results").fetchall() == [("a",)]


class SlowLog:
    """A result log (test double for the journal) that takes 0.5 s to log each stored result and records
    when it was done."""

    def __init__(self) -> None:
        self.logged: dict[str, float] = {}

    def stored(self, seq: int, result: JobResult, request_digest: str) -> None:
        time.sleep(0.5)
        self.logged[result.job_id] = time.monotonic()

    def removed(self, seqs: list[int]) -> None:
        pass


def test_no_answer_shows_a_result_before_it_is_logged(start_server, backend):
    """A job's result reaches its `/process` caller and `GET /jobs/{id}` only once the result store has handed
    it to its log (the journal): an answer that waited for the journal then covers it. While the log is
    busy with it, the job still looks unfinished."""
    server = start_server([backend.address], handlers={"payload": PayloadHandler()})
    log = SlowLog()
    server.state.orchestrator.results.log = log
    seen: list[dict] = []

    def poll() -> None:
        with httpx.Client(base_url=server.url, headers=server.http.headers, timeout=60) as http:
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and "p" not in log.logged:
                response = http.get("/jobs/p")
                if response.status_code == 200:
                    seen.append({**response.json(), "at": time.monotonic()})
                time.sleep(0.02)

    poller = threading.Thread(target=poll)
    poller.start()
    response = server.http.post("/process", json={"instance": {"data_source": "payload"}, "job_id": "p"})
    answered = time.monotonic()
    poller.join()
    assert response.json()["status"] == "completed"
    assert answered >= log.logged["p"]
    early = [s for s in seen if s["at"] < log.logged["p"] - 0.05]
    assert early, "polled while the log was busy"
    assert all(s["result"] is None and s["status"] not in ("completed", "failed") for s in early), early

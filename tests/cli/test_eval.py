"""`prorl-server eval`: the pass@k estimator, the aggregation, a run against a real server, and bad input."""

from __future__ import annotations

import json
import math
import struct
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from handlers_for_tests import NoOpHandler, RaisingHandler
from repo_paths import TESTS

from prorl_server import AgentHandler, JobContext
from prorl_server.cli import main
from prorl_server.evaluation import Sample, aggregate, pass_at_k, table
from prorl_server.testing.uvicorn_thread import free_port


class FirstPassesHandler(AgentHandler):
    """One model turn; the first `instance["passes"]` samples of each instance (by `id`) get reward 1, the
    others 0, so that pass@k > pass@1 whatever the order the jobs run in."""

    name = "first_passes"

    def __init__(self) -> None:
        self.seen: Counter[str] = Counter()

    async def run(self, ctx: JobContext) -> None:
        await ctx.llm.start([{"role": "user", "content": "hi"}])
        await ctx.llm.generate()

    async def eval(self, ctx: JobContext) -> float:
        index = self.seen[ctx.instance["id"]]
        self.seen[ctx.instance["id"]] += 1
        return 1.0 if index < ctx.instance["passes"] else 0.0


def write_tasks(path: Path, instances: list[dict]) -> Path:
    path.write_text("".join(json.dumps(instance) + "\n" for instance in instances))
    return path


def run_eval(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    """`prorl-server eval ARGV` in this process: exit code, stdout, stderr."""
    try:
        main(["eval", *argv])
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    out, err = capsys.readouterr()
    return code, out, err


# pass@k and aggregation --------------------------------------------------------------------------


def test_pass_at_k_known_values():
    assert pass_at_k(10, 3, 1) == pytest.approx(0.3)
    assert pass_at_k(10, 3, 10) == 1.0
    assert pass_at_k(10, 1, 10) == 1.0
    assert pass_at_k(10, 0, 1) == 0.0
    assert pass_at_k(10, 0, 10) == 0.0
    assert pass_at_k(5, 5, 2) == 1.0
    assert pass_at_k(10, 3, 2) == pytest.approx(1 - math.comb(7, 2) / math.comb(10, 2))
    assert pass_at_k(200, 13, 50) == pytest.approx(1 - math.comb(187, 50) / math.comb(200, 50))


@pytest.mark.parametrize(("n", "c", "k"), [(3, 4, 1), (3, -1, 1), (3, 1, 0), (3, 1, 4)])
def test_pass_at_k_refuses_impossible_counts(n, c, k):
    with pytest.raises(ValueError, match="pass@k needs"):
        pass_at_k(n, c, k)


def test_aggregate_per_source_and_overall():
    def s(line: int, source: str, reward: float, *, failed: bool = False, tokens: int = 10) -> Sample:
        return Sample(line, source, reward, reward >= 1.0, failed, tokens)

    samples = [
        s(1, "math", 1.0), s(1, "math", 0.0), s(1, "math", 0.5),  # one instance, 1 of 3 passes
        s(2, "math", 0.0), s(2, "math", 0.0), s(2, "math", 0.0, failed=True, tokens=0),  # none passes
        s(3, "code", 1.0, tokens=4), s(3, "code", 1.0, tokens=4), s(3, "code", 1.0, tokens=4),  # all pass
    ]  # fmt: skip
    report = aggregate(samples, k=3, pass_threshold=1.0, server="http://x", tasks="t.jsonl", wall_s=1.5)
    math_row, code_row, overall = report.sources["math"], report.sources["code"], report.overall
    assert list(report.sources) == ["code", "math"]
    assert (math_row.instances, math_row.samples, math_row.failed) == (2, 6, 1)
    assert math_row.mean_reward == pytest.approx(1.5 / 6)
    assert math_row.pass_at_1 == pytest.approx((1 / 3 + 0) / 2)
    assert math_row.pass_at_k == pytest.approx(0.5)
    assert math_row.mean_tokens == pytest.approx(50 / 6)
    assert (code_row.pass_at_1, code_row.pass_at_k, code_row.mean_tokens) == (1.0, 1.0, 4.0)
    assert (overall.instances, overall.samples, overall.failed) == (3, 9, 1)
    assert overall.pass_at_1 == pytest.approx((1 / 3 + 0 + 1) / 3)
    assert overall.pass_at_k == pytest.approx(2 / 3)
    text = table(report)
    assert text.splitlines()[0].split() == [
        "source", "instances", "samples", "failed", "mean_reward", "pass@1", "pass@3", "mean_tokens"
    ]  # fmt: skip
    assert [line.split()[0] for line in text.splitlines()[1:]] == [
        "code",
        "math",
        "-" * len(text.splitlines()[0]),
        "overall",
        "wall",
    ]


# against a real server ----------------------------------------------------------------------------


def test_eval_against_a_server_prints_the_table_and_writes_json(start_server, backend, tmp_path, capsys):
    handlers = {"first_passes": FirstPassesHandler(), "noop": NoOpHandler(), "raising": RaisingHandler()}
    server = start_server([backend.address], handlers=handlers)
    tasks = write_tasks(
        tmp_path / "tasks.jsonl",
        [
            {"data_source": "first_passes", "id": "a", "passes": 1},
            {"data_source": "first_passes", "id": "b", "passes": 0},
            {"data_source": "noop"},
            {"data_source": "raising", "fail_in": "run"},
        ],
    )
    out_json = tmp_path / "report.json"
    code, out, err = run_eval(
        [str(tasks), "--server", server.url, "--k", "4", "--concurrency", "3", "--json", str(out_json)], capsys
    )
    assert code == 0, err
    report = json.loads(out_json.read_text())
    assert set(report) == {"k", "pass_threshold", "server", "tasks", "wall_s", "sources", "overall"}
    assert (report["k"], report["pass_threshold"], report["server"]) == (4, 1.0, server.url)
    first = report["sources"]["first_passes"]
    assert (first["instances"], first["samples"], first["failed"]) == (2, 8, 0)
    assert first["pass_at_1"] == pytest.approx(0.125)  # a: 1 of 4, b: 0 of 4
    assert first["pass_at_k"] == pytest.approx(0.5)  # a passes at 4, b does not
    assert first["pass_at_k"] > first["pass_at_1"]
    assert first["mean_reward"] == pytest.approx(0.125)
    assert first["mean_tokens"] > 0  # one model turn each
    assert report["sources"]["noop"] | {"mean_tokens": 0} == {
        "instances": 1, "samples": 4, "failed": 0, "mean_reward": 1.0, "pass_at_1": 1.0, "pass_at_k": 1.0,
        "mean_tokens": 0,
    }  # fmt: skip
    failing = report["sources"]["raising"]
    assert (failing["failed"], failing["mean_reward"], failing["pass_at_k"]) == (4, 0.0, 0.0)
    overall = report["overall"]
    assert (overall["instances"], overall["samples"], overall["failed"]) == (4, 16, 4)
    assert overall["pass_at_1"] == pytest.approx((0.25 + 0 + 1 + 0) / 4)
    assert overall["pass_at_k"] == pytest.approx(0.5)
    assert report["wall_s"] > 0
    lines = out.splitlines()
    assert "pass@4" in lines[0].split()
    by_name = {line.split()[0]: line.split() for line in lines[1:]}
    assert by_name["first_passes"][1:7] == ["2", "8", "0", "0.1250", "0.1250", "0.5000"]
    assert by_name["overall"][1:7] == ["4", "16", "4", "0.3125", "0.3125", "0.5000"]
    assert lines[-1].startswith("wall time ")


class ConfigEchoHandler(AgentHandler):
    """No model turn; reward 1 when the job carries the sampling params and agent config the test sends."""

    name = "config_echo"

    async def run(self, ctx: JobContext) -> None:
        pass

    async def eval(self, ctx: JobContext) -> float:
        return float(ctx.sampling_params.get("temperature") == 0.5 and ctx.agent_config == {"max_turns": 2})


def test_sampling_params_and_agent_config_reach_every_job(start_server, backend, tmp_path, capsys):
    server = start_server([backend.address], handlers={"config_echo": ConfigEchoHandler()})
    tasks = write_tasks(tmp_path / "tasks.jsonl", [{"data_source": "config_echo"}])
    sent = ["--sampling-params", '{"temperature": 0.5}', "--agent-config", '{"max_turns": 2}']
    code, out, err = run_eval([str(tasks), "--server", server.url, "--k", "3", *sent], capsys)
    assert code == 0, err
    overall = next(line.split() for line in out.splitlines() if line.startswith("overall"))
    assert overall[1:7] == ["1", "3", "0", "1.0000", "1.0000", "1.0000"]
    code, _, err = run_eval([str(tasks), "--server", server.url, "--agent-config", "[2]"], capsys)
    assert code == 2 and err.strip() == "prorl-server eval: --agent-config must be a JSON object"


# bad input ----------------------------------------------------------------------------------------


def test_missing_tasks_file(tmp_path, capsys):
    code, out, err = run_eval([str(tmp_path / "nope.jsonl"), "--server", "http://127.0.0.1:1"], capsys)
    assert code == 2 and not out
    assert err.strip().startswith("prorl-server eval: cannot read the tasks file") and len(err.splitlines()) == 1


def test_malformed_line_is_named(tmp_path, capsys):
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text('{"data_source": "noop"}\n\n{"data_source": \n')
    code, _, err = run_eval([str(tasks), "--server", "http://127.0.0.1:1"], capsys)
    assert code == 2 and len(err.splitlines()) == 1
    assert f"{tasks}:3: not JSON" in err


def test_line_without_data_source_is_named(tmp_path, capsys):
    tasks = write_tasks(tmp_path / "tasks.jsonl", [{"data_source": "noop"}, {"question": "x"}])
    code, _, err = run_eval([str(tasks), "--server", "http://127.0.0.1:1"], capsys)
    assert code == 2 and f"{tasks}:2: not a JSON object with a string data_source" in err


def test_invalid_job_is_named_by_its_line(tmp_path, capsys):
    tasks = write_tasks(tmp_path / "tasks.jsonl", [{"data_source": "noop"}])
    argv = [str(tasks), "--server", "http://127.0.0.1:1", "--timeout", "-1"]
    code, _, err = run_eval(argv, capsys)
    assert code == 2 and err.startswith("prorl-server eval: line 1: not a valid job: timeout: ")


@pytest.mark.parametrize("k", ["0", "-2"])
def test_k_below_one(tmp_path, capsys, k):
    tasks = write_tasks(tmp_path / "tasks.jsonl", [{"data_source": "noop"}])
    code, _, err = run_eval([str(tasks), "--server", "http://127.0.0.1:1", "--k", k], capsys)
    assert code == 2 and err.strip() == f"prorl-server eval: --k must be at least 1, got {k}"


def test_unreachable_server(tmp_path, capsys):
    tasks = write_tasks(tmp_path / "tasks.jsonl", [{"data_source": "noop"}])
    url = f"http://127.0.0.1:{free_port()}"
    code, out, err = run_eval([str(tasks), "--server", url, "--no-progress"], capsys)
    assert code == 2 and not out and len(err.splitlines()) == 1
    assert err.startswith(f"prorl-server eval: the server {url} did not answer")


def test_unknown_data_source(start_server, backend, tmp_path, capsys):
    server = start_server([backend.address], handlers={"noop": NoOpHandler()})
    tasks = write_tasks(tmp_path / "tasks.jsonl", [{"data_source": "noop"}, {"data_source": "nosuch"}])
    code, _, err = run_eval([str(tasks), "--server", server.url], capsys)
    assert code == 2 and "line 2: data_source 'nosuch': the server has no handler for it" in err


def test_missing_tracking_package_is_named_before_running(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(__import__("sys").modules, "wandb", None)  # import wandb -> ImportError
    tasks = write_tasks(tmp_path / "tasks.jsonl", [{"data_source": "noop"}])
    code, _, err = run_eval([str(tasks), "--server", "http://127.0.0.1:1", "--wandb-offline", str(tmp_path)], capsys)
    assert code == 2 and err.strip() == (
        "prorl-server eval: wandb is not installed: pip install wandb (or prorl-server[tracking])"
    )


# tracking ------------------------------------------------------------------------------------------


def test_mlflow_logs_params_metrics_and_the_table(start_server, backend, tmp_path, capsys, monkeypatch):
    mlflow = pytest.importorskip("mlflow")
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # a directory store: mlflow-skinny has no sqlalchemy
    server = start_server([backend.address], handlers={"noop": NoOpHandler()})
    tasks = write_tasks(tmp_path / "tasks.jsonl", [{"data_source": "noop"}])
    uri = (tmp_path / "mlruns").as_uri()
    argv = [str(tasks), "--server", server.url, "--k", "2", "--mlflow-uri", uri, "--run-name", "smoke"]
    code, _, err = run_eval(argv, capsys)
    assert code == 0, err
    client = mlflow.tracking.MlflowClient(tracking_uri=uri)
    (run,) = client.search_runs([client.get_experiment_by_name("prorl-eval").experiment_id])
    assert run.info.run_name == "smoke"
    assert run.data.params == {"k": "2", "server": server.url, "tasks": str(tasks), "pass_threshold": "1.0"}
    assert run.data.metrics["overall/pass_at_k"] == 1.0 and run.data.metrics["noop/mean_reward"] == 1.0
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {"eval_table.txt", "eval_report.json"} <= artifacts


def wandb_records(path: Path) -> Iterator[Any]:
    """The records of an offline W&B run's `run-<id>.wandb` file, parsed with W&B's own protobuf schema. (The
    file is a LevelDB-style log after a 7-byte header: 32 KiB blocks of chunks, each `crc32 length type`;
    W&B 0.19+ ships no Python reader of it.)"""
    from wandb.proto import wandb_internal_pb2

    data, block = path.read_bytes(), 32 * 1024
    assert data[:4] == b":W&B", f"{path} is no W&B transaction log"
    position, chunks = 7, []
    while position + 7 <= len(data):
        if block - position % block < 7:  # a block's tail too short for a header is padding
            position += block - position % block
            continue
        _crc, length, kind = struct.unpack("<IHB", data[position : position + 7])
        chunks.append(data[position + 7 : position + 7 + length])
        position += 7 + length
        if kind in (1, 4):  # a whole record, or a record's last chunk
            record = wandb_internal_pb2.Record()
            record.ParseFromString(b"".join(chunks))
            chunks = []
            yield record


def test_wandb_offline_logs_params_metrics_and_the_table(start_server, backend, tmp_path, capsys):
    pytest.importorskip("wandb")
    server = start_server([backend.address], handlers={"noop": NoOpHandler()})
    tasks = write_tasks(tmp_path / "tasks.jsonl", [{"data_source": "noop"}])
    runs = tmp_path / "wandb-runs"
    argv = [str(tasks), "--server", server.url, "--k", "2", "--wandb-offline", str(runs), "--run-name", "smoke"]
    code, _, err = run_eval(argv, capsys)
    assert code == 0, err
    (run_dir,) = (runs / "wandb").glob("offline-run-*")
    run_id = run_dir.name.rsplit("-", 1)[1]
    assert f"W&B offline run {run_id} in {runs}" in err
    records = list(wandb_records(run_dir / f"run-{run_id}.wandb"))
    (run,) = [r.run for r in records if r.WhichOneof("record_type") == "run"]
    assert run.display_name == "smoke" and run.project == "prorl-eval"
    config = {item.key: json.loads(item.value_json) for item in run.config.update if item.key != "_wandb"}
    assert config == {"k": 2, "server": server.url, "tasks": str(tasks), "pass_threshold": 1.0}
    history = {}
    for record in records:
        if record.WhichOneof("record_type") == "history":
            history |= {
                item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in record.history.item
            }
    assert history["overall/pass_at_k"] == 1.0 and history["noop/mean_reward"] == 1.0
    assert history["eval_table/_type"] == "table-file" and history["eval_table/nrows"] == 2  # noop, overall
    assert (run_dir / "files" / "eval_table.txt").read_text().splitlines()[0].split()[0] == "source"


def test_a_tracker_that_fails_is_one_line_after_the_table(start_server, backend, tmp_path, capsys):
    pytest.importorskip("mlflow")
    server = start_server([backend.address], handlers={"noop": NoOpHandler()})
    tasks = write_tasks(tmp_path / "tasks.jsonl", [{"data_source": "noop"}])
    argv = [str(tasks), "--server", server.url, "--mlflow-uri", "nosuch://store"]
    code, out, err = run_eval(argv, capsys)
    assert code == 2 and out.splitlines()[-2].split()[:3] == ["overall", "1", "1"]
    assert err.startswith("prorl-server eval: logging to MLflow failed: ") and len(err.splitlines()) == 1


# --local ------------------------------------------------------------------------------------------


def test_local_starts_a_server_for_the_run_and_stops_it(backend, tmp_path, capsys):
    tasks = write_tasks(tmp_path / "tasks.jsonl", [{"data_source": "noop"}, {"data_source": "noop"}])
    handler = f"--serve-arg=--handler={TESTS / 'handlers_for_tests.py'}:NoOpHandler"
    argv = [str(tasks), "--local", "--llm-server", backend.address, handler, "--serve-arg=--no-entry-points"]
    code, out, err = run_eval([*argv, "--k", "3", "--json", str(tmp_path / "r.json")], capsys)
    assert code == 0, err
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["server"] == "local"
    assert report["overall"] | {"mean_tokens": 0} == {
        "instances": 2, "samples": 6, "failed": 0, "mean_reward": 1.0, "pass_at_1": 1.0, "pass_at_k": 1.0,
        "mean_tokens": 0,
    }  # fmt: skip
    assert "overall" in out


def test_local_server_that_does_not_start_is_one_line(backend, tmp_path, capsys):
    tasks = write_tasks(tmp_path / "tasks.jsonl", [{"data_source": "noop"}])
    argv = [str(tasks), "--local", "--llm-server", backend.address, "--serve-arg=--handler=/nonexistent.py:Nope"]
    code, out, err = run_eval(argv, capsys)
    assert code == 2 and not out and len(err.splitlines()) == 1
    assert err.startswith("prorl-server eval: the local stack did not start: prorl_server exited with code")


def test_local_only_options_need_local(tmp_path, capsys):
    tasks = write_tasks(tmp_path / "tasks.jsonl", [{"data_source": "noop"}])
    code, _, err = run_eval([str(tasks), "--server", "http://127.0.0.1:1", "--serve-arg=--x"], capsys)
    assert code == 2 and err.strip() == "prorl-server eval: --llm-server and --serve-arg are for --local"

"""A handler bug is findable (logged once, located in the result and in GET /handlers), and a bad instance
is refused at submission by the handler's validation."""

from __future__ import annotations

import asyncio
import json
import logging
import re
import sys
import time
from pathlib import Path

import httpx
import pytest
from polling import wait_for
from pydantic import BaseModel
from repo_paths import DOCS

from prorl_server import AgentHandler, JobContext
from prorl_server.api import ServerState, create_app
from prorl_server.config import ServerSettings
from prorl_server.handlers import HandlerLoadError, HandlerRegistry
from prorl_server.handlers.failure import TRACEBACK_MAX_CHARS
from prorl_server.testing import UvicornThread

THIS_FILE = Path(__file__).resolve()
PIPELINE_LOGGER = "prorl_server.pipeline"


def line_of(marker: str) -> int:
    """The line of this file holding `marker` in a comment."""
    lines = THIS_FILE.read_text().splitlines()
    return next(i for i, line in enumerate(lines, 1) if line.rstrip().endswith(f"# {marker}"))


def _deep(depth: int) -> None:
    if depth:
        _deep(depth - 1)
    raise KeyError("deep_key")  # deep raise


class BuggyHandler(AgentHandler):
    """RUN fails as `instance["bug"]` says: a KeyError, a JSON error raised inside the standard library, or a
    KeyError 40 calls deep; `sleep` makes RUN sleep (for timeouts and cancels)."""

    name = "buggy"

    async def run(self, ctx: JobContext) -> None:
        bug = ctx.instance.get("bug")
        if bug == "sleep":
            await asyncio.sleep(30)
        if bug == "json":
            json.loads("{not json")  # json bug
        if bug == "deep":
            _deep(40)
        ctx.artifacts["answer"] = ctx.instance["missing_key"]  # key bug

    async def eval(self, ctx: JobContext) -> float:
        return 1.0


class SyncBuggyHandler(AgentHandler):
    """A plain-def RUN (run in a worker thread) with a KeyError."""

    def run(self, ctx: JobContext) -> None:
        ctx.artifacts["answer"] = ctx.instance["missing_key"]  # sync key bug

    def eval(self, ctx: JobContext) -> float:
        return 1.0


def warnings_about(caplog, job_id: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.levelno == logging.WARNING and job_id in r.getMessage()]


@pytest.fixture
def buggy(start_server, backend):
    return start_server([backend.address], handlers={"buggy": BuggyHandler(), "sync_buggy": SyncBuggyHandler()})


def test_handler_bug_is_located_in_the_result_and_logged_once(buggy, caplog):
    caplog.set_level(logging.WARNING, logger=PIPELINE_LOGGER)
    body = {"instance": {"data_source": "buggy"}, "job_id": "bug-1"}
    result = buggy.http.post("/process", json=body).json()
    assert result["status"] == "failed"
    error = result["error"]
    assert (error["stage"], error["type"]) == ("run", "KeyError")
    assert error["location"] == f"{THIS_FILE}:{line_of('key bug')} in run"
    assert "KeyError: 'missing_key'" in error["traceback"] and str(THIS_FILE) in error["traceback"]
    assert len(error["traceback"]) <= TRACEBACK_MAX_CHARS

    [record] = warnings_about(caplog, "bug-1")
    message = record.getMessage()
    assert "'buggy'" in message and "failed in run" in message and "KeyError" in message
    assert f"{THIS_FILE}:{line_of('key bug')}" in message
    assert record.exc_info is not None and record.exc_info[0] is KeyError


def test_location_skips_the_standard_library_and_the_traceback_is_bounded(buggy):
    parse = buggy.http.post("/process", json={"instance": {"data_source": "buggy", "bug": "json"}}).json()
    assert parse["error"]["type"] == "JSONDecodeError"
    assert parse["error"]["location"] == f"{THIS_FILE}:{line_of('json bug')} in run"
    assert "json/decoder.py" in parse["error"]["traceback"]  # the frames themselves are kept

    deep = buggy.http.post("/process", json={"instance": {"data_source": "buggy", "bug": "deep"}}).json()
    assert deep["error"]["location"] == f"{THIS_FILE}:{line_of('deep raise')} in _deep"
    traceback = deep["error"]["traceback"]
    assert "earlier frames" in traceback and traceback.endswith("KeyError: 'deep_key'")
    assert len(traceback) <= TRACEBACK_MAX_CHARS

    threaded = buggy.http.post("/process", json={"instance": {"data_source": "sync_buggy"}}).json()
    assert threaded["error"]["location"] == f"{THIS_FILE}:{line_of('sync key bug')} in run"


def test_timeout_is_logged_once_and_a_cancel_is_not(buggy, caplog):
    caplog.set_level(logging.WARNING, logger=PIPELINE_LOGGER)
    sleepy = {"data_source": "buggy", "bug": "sleep"}
    result = buggy.http.post("/process", json={"instance": sleepy, "job_id": "slow-1", "timeout": 0.3}).json()
    assert result["status"] == "timeout"
    assert result["error"]["location"] is None and result["error"]["traceback"] is None
    [record] = warnings_about(caplog, "slow-1")
    assert "timed out in run" in record.getMessage() and "'buggy'" in record.getMessage()

    assert buggy.http.post("/jobs", json={"instance": sleepy, "job_id": "cancel-1"}).status_code == 202
    wait_for(lambda: buggy.http.get("/jobs/cancel-1").json()["status"] == "run", 10, "job cancel-1 running")
    assert buggy.http.delete("/jobs/cancel-1").json()["status"] == "cancelled"
    assert not [r for r in caplog.records if "cancel-1" in r.getMessage() and r.levelno >= logging.WARNING]


RAISES_AT_IMPORT = """from prorl_server import AgentHandler

SETTINGS = {}
LIMIT = SETTINGS["limit"]
"""

SYNTAX_ERROR = """from prorl_server import AgentHandler

class Broken(AgentHandler)
    pass
"""


@pytest.fixture
def broken_plugins(tmp_path, monkeypatch) -> Path:
    """A fake installed distribution whose two entry points fail to import: a KeyError and a SyntaxError."""
    (tmp_path / "raising_plugin_xyz.py").write_text(RAISES_AT_IMPORT)
    (tmp_path / "syntax_plugin_xyz.py").write_text(SYNTAX_ERROR)
    dist = tmp_path / "broken_plugins_xyz-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: broken-plugins-xyz\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text(
        "[prorl_server.handlers]\nraising_xyz = raising_plugin_xyz:Handler\nsyntax_xyz = syntax_plugin_xyz:Broken\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    for name in ("raising_plugin_xyz", "syntax_plugin_xyz"):
        sys.modules.pop(name, None)


def test_plugin_import_errors_name_file_and_line(broken_plugins, backend, caplog):
    caplog.set_level(logging.ERROR, logger="prorl_server.handlers")
    state = ServerState.build(ServerSettings(llm_servers=[backend.address]))
    with UvicornThread(create_app(state=state)) as server:
        listed = {h["data_source"]: h for h in httpx.get(f"{server.url}/handlers").json()}
    raising, syntax = listed["raising_xyz"], listed["syntax_xyz"]
    assert not raising["loaded"] and not syntax["loaded"]
    assert raising["error"].startswith("KeyError: 'limit'")
    assert raising["error"].endswith(f"(at {broken_plugins / 'raising_plugin_xyz.py'}:4 in <module>)")
    assert syntax["error"].startswith("SyntaxError:")
    assert syntax["error"].endswith(f"(at {broken_plugins / 'syntax_plugin_xyz.py'}:3)")
    logged = caplog.text
    assert "raising_plugin_xyz.py:4" in logged and "syntax_plugin_xyz.py:3" in logged


def test_handler_file_target_import_error_names_file_and_line(tmp_path):
    plugin = tmp_path / "bad_task.py"
    plugin.write_text(RAISES_AT_IMPORT)
    with pytest.raises(HandlerLoadError, match=rf"KeyError: 'limit' \(at {plugin}:4 in <module>\)"):
        HandlerRegistry().add_target(f"bad={plugin}:Handler")


class CapitalsRow(BaseModel):
    data_source: str
    country: str
    capital: str


class ValidatedHandler(AgentHandler):
    """Declares its instance schema; counts how often validation ran."""

    name = "validated"
    instance_model = CapitalsRow

    def __init__(self) -> None:
        self.validations = 0

    def validate_instance(self, instance: dict) -> None:
        self.validations += 1
        super().validate_instance(instance)
        if instance["capital"] == instance["country"]:
            raise ValueError("field 'capital' must differ from 'country'")

    async def run(self, ctx: JobContext) -> None:
        ctx.artifacts["capital"] = ctx.instance["capital"]

    async def eval(self, ctx: JobContext) -> float:
        return 1.0


class CrashingValidator(AgentHandler):
    name = "crashing"

    def validate_instance(self, instance: dict) -> None:
        instance["expected"].lower()  # validator bug

    async def run(self, ctx: JobContext) -> None:
        return None

    async def eval(self, ctx: JobContext) -> float:
        return 1.0


class AsyncValidator(CrashingValidator):
    name = "async_validator"

    async def validate_instance(self, instance: dict) -> None:  # type: ignore[override]
        return None


@pytest.fixture
def validated(start_server, backend):
    handlers = {"validated": ValidatedHandler(), "crashing": CrashingValidator(), "async": AsyncValidator()}
    return start_server([backend.address], handlers=handlers)


def no_jobs(server) -> bool:
    jobs = server.http.get("/status").json()["jobs"]
    return jobs == {"stored_results": 0}


def test_instance_model_refuses_a_bad_row_with_400_naming_the_field(validated):
    bad = {"data_source": "validated", "country": "France"}
    for path in ("/process", "/jobs"):
        response = validated.http.post(path, json={"instance": bad, "job_id": "bad-row"})
        assert response.status_code == 400, response.text
        detail = response.json()["detail"]
        assert "'validated'" in detail and "field 'capital': Field required" in detail
    wrong_type = {"data_source": "validated", "country": "France", "capital": ["Paris"]}
    detail = validated.http.post("/jobs", json={"instance": wrong_type}).json()["detail"]
    assert "field 'capital': Input should be a valid string" in detail and "Paris" not in detail
    same = {"data_source": "validated", "country": "Paris", "capital": "Paris"}
    refused = validated.http.post("/process", json={"instance": same})
    assert refused.status_code == 400 and "field 'capital' must differ from 'country'" in refused.json()["detail"]
    assert no_jobs(validated)
    assert validated.http.get("/jobs/bad-row").status_code == 404


def test_valid_instance_runs(validated):
    good = {"data_source": "validated", "country": "France", "capital": "Paris"}
    result = validated.http.post("/process", json={"instance": good}).json()
    assert result["status"] == "completed" and result["artifacts"] == {"capital": "Paris"}


def test_a_crashing_or_async_validator_is_a_400_naming_the_handler_bug(validated, caplog):
    caplog.set_level(logging.WARNING, logger=PIPELINE_LOGGER)
    response = validated.http.post("/process", json={"instance": {"data_source": "crashing"}})
    assert response.status_code == 400
    detail = response.json()["detail"]
    assert "validator of handler 'crashing' crashed: KeyError" in detail and "bug in the handler" in detail
    assert f"{THIS_FILE}:{line_of('validator bug')} in validate_instance" in detail
    assert [r for r in caplog.records if r.levelno == logging.WARNING and "'crashing'" in r.getMessage()]

    response = validated.http.post("/jobs", json={"instance": {"data_source": "async"}})
    assert response.status_code == 400 and "must be a plain def" in response.json()["detail"]
    assert no_jobs(validated)


def test_groups_validate_once_and_launch_nothing_for_a_bad_instance(validated):
    handler = validated.state.orchestrator.registry.get("validated")
    bad = {"instance": {"data_source": "validated", "country": "France"}, "n": 2, "n_launch": 3, "group_id": "g-bad"}
    response = validated.http.post("/groups", json=bad)
    assert response.status_code == 400 and "field 'capital'" in response.json()["detail"]
    assert validated.http.get("/groups/g-bad").status_code == 404
    assert no_jobs(validated)
    assert handler.validations == 1

    good = {**bad, "instance": {**bad["instance"], "capital": "Paris"}, "group_id": "g-good"}
    group = validated.http.post("/groups", json=good).json()
    assert group["status"] == "completed" and len(group["results"]) == 2
    assert handler.validations == 2  # once for the group, not once per member


def test_the_validation_example_of_the_guide_runs(start_server, backend):
    text = (DOCS / "handlers.md").read_text()
    section = text[text.index("### Checking instances at submission") :]
    code = re.search(r"```python\n(.*?)```", section, re.DOTALL).group(1)
    namespace: dict = {}
    exec(compile(code, "docs/handlers.md", "exec"), namespace)
    server = start_server([backend.address], handlers={"capitals_checked": namespace["CheckedCapitalsHandler"]()})

    missing = server.http.post("/process", json={"instance": {"data_source": "capitals_checked", "country": "X"}})
    assert missing.status_code == 400
    assert missing.json()["detail"] == "instance refused by handler 'capitals_checked': field 'capital': Field required"
    same = {"data_source": "capitals_checked", "country": "Monaco", "capital": "monaco"}
    assert "must differ" in server.http.post("/jobs", json={"instance": same}).json()["detail"]
    assert no_jobs(server)

    backend.double.push("Paris.")
    good = {"data_source": "capitals_checked", "country": "France", "capital": "Paris"}
    result = server.http.post("/process", json={"instance": good}).json()
    assert result["status"] == "completed" and result["reward"] == 1.0


class UnusableOutcomeHandler(AgentHandler):
    """EVAL returns an int too large for a float (`instance["huge"]`); final_result (for `instance["status"]`)
    sets a plain string status and counts its calls; RUN (for `instance["stop"]`) lets StopIteration out of
    a function run by asyncio.to_thread."""

    name = "unusable"

    def __init__(self) -> None:
        self.final_calls = 0

    async def run(self, ctx: JobContext) -> None:
        ctx.artifacts["kept"] = True
        if ctx.instance.get("stop"):
            await asyncio.to_thread(next, iter([]))

    async def eval(self, ctx: JobContext) -> int:
        return 10**400 if ctx.instance.get("huge") else 1

    async def final_result(self, ctx: JobContext, result):
        self.final_calls += 1
        if "status" in ctx.instance:
            result.status = ctx.instance["status"]  # a plain string, not a JobStatus
        return result


@pytest.fixture
def unusable(start_server, backend):
    handler = UnusableOutcomeHandler()
    server = start_server([backend.address], handlers={"unusable": handler})
    return server, handler


def test_a_reward_too_large_for_a_float_is_the_handlers_bad_value(unusable):
    server, _ = unusable
    result = server.http.post("/process", json={"instance": {"data_source": "unusable", "huge": True}}).json()
    assert result["status"] == "failed" and result["reward"] is None
    error = result["error"]
    assert (error["stage"], error["type"]) == ("eval", "ValueError")
    assert "too large for a float" in error["message"] and "report" not in error["message"]


def test_a_plain_string_status_from_final_result_is_refused_once_keeping_the_result(unusable):
    server, handler = unusable
    instance = {"data_source": "unusable", "status": "running"}
    result = server.http.post("/process", json={"instance": instance}).json()
    assert result["status"] == "failed"
    error = result["error"]
    assert error["stage"] == "final_result" and error["type"] == "TypeError"
    assert "'running'" in error["message"] and "terminal" in error["message"]
    assert handler.final_calls == 1
    assert result["artifacts"] == {"kept": True} and result["timing"]["total_s"] > 0

    done = server.http.post("/process", json={"instance": {"data_source": "unusable", "status": "completed"}})
    assert done.json()["status"] == "completed" and done.json()["reward"] == 1.0


def test_stop_iteration_out_of_to_thread_fails_the_job_at_once(unusable):
    server, _ = unusable
    body = {"instance": {"data_source": "unusable", "stop": True}, "timeout": 20}
    started = time.monotonic()
    result = server.http.post("/process", json=body, timeout=30).json()
    assert time.monotonic() - started < 10
    assert result["status"] == "failed"
    error = result["error"]
    assert error["stage"] == "run" and "StopIteration" in error["message"]

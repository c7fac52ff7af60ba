"""`harbor`: the Harbor task folders of examples/harbor-tasks/ built from their Dockerfiles (FROM mapped to
the local base of scripts/setup-apptainer.sh, one base for all), run by their oracle solutions to reward 1.0
and by an agent that does nothing to 0.0, on Apptainer, bubblewrap and Podman (the built image unpacked to a
root directory, which podman runs with `--rootfs DIR:O`); the agent loop solving one on the scripted double; and bad task folders refused at submission
with the file and field named, a build past its timeout failing the job with the Dockerfile's line."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from prorl_handlers.harbor import HarborHandler, TaskError, load_task
from repo_paths import EXAMPLES
from server_jobs import result, submit

from prorl_server.sandbox.apptainer import ENV_BINARY, find_apptainer
from prorl_server.sandbox.registry import unavailable_reason

TASKS_DIR = EXAMPLES / "harbor-tasks"
TASKS = sorted(path.name for path in TASKS_DIR.iterdir() if path.is_dir())
BASE = Path("/tmp/apptainer-test/imgroot")
BASE_MAP = {"debian:bookworm": BASE}
TOML = 'version = "1.0"\n\n[agent]\ntimeout_sec = 60.0\n\n[environment]\nbuild_timeout_sec = 600.0\n'


# a harness that does nothing: it reads its instruction, finds its files and changes no file of the task; the
# reward it tries to write for itself (there is no /logs/verifier in RUN, and EVAL's is fresh) does not count
NOTHING = (
    "(mkdir -p /logs/verifier && echo 1 > /logs/verifier/reward.txt) 2>/dev/null; "
    'printf "%s\\n" "$HARBOR_INSTRUCTION" | head -1; bash /tmp/harbor-agent/bin/harness.sh'
)
HARNESS = {"bin/harness.sh": "echo harness here\n"}


def task_folder(
    root: Path, name: str, toml: str = TOML, dockerfile: str = "FROM debian:bookworm\nWORKDIR /app\n"
) -> Path:
    """A task folder with every file a Harbor task has (override what a test needs)."""
    path = root / name
    files = {
        "task.toml": toml,
        "instruction.md": "Do nothing.\n",
        "environment/Dockerfile": dockerfile,
        "tests/test.sh": "echo 1 > /logs/verifier/reward.txt\n",
        "solution/solve.sh": "true\n",
    }
    for relative, text in files.items():
        (path / relative).parent.mkdir(parents=True, exist_ok=True)
        (path / relative).write_text(text)
    return path


def instance(task: str, **fields) -> dict:
    return {"data_source": "harbor", "task": task, **fields}


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The module's image cache (under /tmp, where apptainer sees it): each task's image is built once."""
    if find_apptainer() is None:
        pytest.skip(f"needs apptainer (PATH or {ENV_BINARY}); as root: bash scripts/setup-apptainer.sh")
    if not BASE.is_dir():
        pytest.skip(f"needs the base image {BASE}: bash scripts/setup-apptainer.sh")
    return tmp_path_factory.mktemp("harbor-cache")


@pytest.mark.parametrize("runtime", ["apptainer", "bwrap", "podman"])
def test_every_shipped_task_scores_1_by_its_oracle_and_0_when_nothing_is_done(start_server, strict, cache, runtime):
    if (reason := unavailable_reason(runtime)) is not None:
        pytest.skip(f"{runtime}: {reason}")
    handler = HarborHandler(TASKS_DIR, BASE_MAP, cache)
    server = start_server([strict.address], handlers={"harbor": handler}, runtime=runtime, init_workers=2)
    server.state.gateway.public_url = server.url  # the test server binds a free port
    assert len(TASKS) >= 5
    for task in TASKS:
        submit(server, f"{task}-oracle", instance=instance(task, agent="oracle"))
        submit(server, f"{task}-nothing", instance=instance(task, agent="command", command=NOTHING, files=HARNESS))
    for task in TASKS:
        solved = result(server, f"{task}-oracle", timeout=600)
        assert solved["status"] == "completed" and solved["reward"] == 1.0, (task, solved["error"], solved["eval"])
        assert solved["artifacts"]["agent"]["exit_code"] == 0, solved["artifacts"]["agent"]
        assert solved["eval"]["rewards"]["reward"] == 1.0
        untouched = result(server, f"{task}-nothing", timeout=600)
        assert untouched["status"] == "completed" and untouched["reward"] == 0.0, (task, untouched["eval"])
        first_line = (TASKS_DIR / task / "instruction.md").read_text().splitlines()[0]
        assert untouched["artifacts"]["agent"]["output"].splitlines() == [first_line, "harness here"], task
    assert result(server, "top-words-oracle")["eval"]["rewards"]["pairs_right"] == 3  # reward.json's other numbers
    assert not list((cache / "harbor-jobs").iterdir())  # every job's binds removed


def test_the_agent_loop_gets_the_instruction_and_its_work_is_scored(start_server, strict, cache):
    """The model's bash call in the loop writes the answer in the working directory; EVAL scores it there."""
    if (reason := unavailable_reason("apptainer")) is not None:
        pytest.skip(f"apptainer: {reason}")
    server = start_server([strict.address], handlers={"harbor": HarborHandler(TASKS_DIR, BASE_MAP, cache)})
    command = "awk '$9 == 404' access.log | wc -l > answer.txt && cat answer.txt"
    call = {"name": "bash", "arguments": {"command": command}}
    strict.double.push(
        f"<tool_call>\n{json.dumps(call)}\n</tool_call>",
        '<tool_call>\n{"name": "submit", "arguments": {}}\n</tool_call>',
        job="loop",
    )
    submit(server, "loop", instance=instance("count-lines"))
    res = result(server, "loop", timeout=600)
    assert res["status"] == "completed" and res["reward"] == 1.0, (res["error"], res["eval"])
    prompt = strict.double.tokenizer.decode(strict.double.requests[0].prompt)
    assert "/app/access.log" in prompt and "status code 404" in prompt
    assert res["artifacts"]["agent"]["stop_reason"] == "submitted" and res["artifacts"]["image"]["seconds"] > 0


# a harness with the standard library only (the task's image has no openai package): one chat completion
# through the job's gateway session, whose reply it runs as a shell command
ONE_SHOT = """
import json, os, subprocess, urllib.request
body = {"model": os.environ["OPENAI_MODEL"], "messages": [{"role": "user", "content": os.environ["HARBOR_INSTRUCTION"]}]}
headers = {"content-type": "application/json", "authorization": "Bearer " + os.environ["OPENAI_API_KEY"]}
url = os.environ["OPENAI_BASE_URL"].rstrip("/") + "/chat/completions"
reply = json.load(urllib.request.urlopen(urllib.request.Request(url, json.dumps(body).encode(), headers)))
subprocess.run(["bash", "-c", reply["choices"][0]["message"]["content"]], check=True)
"""


@pytest.mark.parametrize("runtime", ["apptainer", "bwrap", "podman"])
def test_a_harness_command_reaches_the_gateway_from_the_task_s_image(start_server, strict, cache, runtime):
    if (reason := unavailable_reason(runtime)) is not None:
        pytest.skip(f"{runtime}: {reason}")
    handler = HarborHandler(TASKS_DIR, BASE_MAP, cache)
    server = start_server([strict.address], handlers={"harbor": handler}, runtime=runtime)
    server.state.gateway.public_url = server.url
    strict.double.push("awk '$9 == 404' access.log | wc -l > answer.txt", job=f"harness-{runtime}")
    command = "python3 /tmp/harbor-agent/one_shot.py"
    files = {"one_shot.py": ONE_SHOT}
    submit(
        server, f"harness-{runtime}", instance=instance("count-lines", agent="command", command=command, files=files)
    )
    res = result(server, f"harness-{runtime}", timeout=600)
    assert res["status"] == "completed" and res["reward"] == 1.0, (res["error"], res["artifacts"], res["eval"])
    [recording] = res["artifacts"]["gateway"]
    assert recording["calls"] == 1 and "status code 404" in recording["segments"][0]["messages"][0]["content"]


def test_the_task_s_timeouts_and_memory_hold_the_agent_and_the_tests(start_server, strict, cache, tmp_path):
    """greet-script's environment unchanged (its image reused); task.toml with short agent and verifier timeouts."""
    task = tmp_path / "slow-greet"
    shutil.copytree(TASKS_DIR / "greet-script", task)
    toml = (task / "task.toml").read_text()
    toml = toml.replace("[verifier]\ntimeout_sec = 60.0", "[verifier]\ntimeout_sec = 3")
    toml = toml.replace("[agent]\ntimeout_sec = 300.0", "[agent]\ntimeout_sec = 3").replace("1024", "700")
    (task / "task.toml").write_text(toml)
    (task / "solution" / "solve.sh").write_text("ulimit -v\nsleep 60\n")
    (task / "tests" / "test.sh").write_text("echo 1 > /logs/verifier/reward.txt\nsleep 60\n")
    server = start_server([strict.address], handlers={"harbor": HarborHandler(tmp_path, BASE_MAP, cache)})
    submit(server, "slow", instance=instance("slow-greet", agent="oracle"))
    res = result(server, "slow", timeout=300)
    assert res["status"] == "completed" and res["reward"] == 0.0, res
    agent = res["artifacts"]["agent"]
    assert agent["timed_out"] and agent["output"].split()[0] == str(700 * 1024), agent
    assert res["eval"]["tests_timed_out"] and res["eval"]["error"] == "tests/test.sh ran past 3 s"


def test_a_build_past_its_timeout_fails_the_job_at_its_dockerfile_line(start_server, strict, cache, tmp_path):
    # 15 s: past the base's extraction even on a loaded machine (3 s once ran out before the RUN line began)
    toml = TOML.replace("build_timeout_sec = 600.0", "build_timeout_sec = 15")
    task_folder(tmp_path, "slow", toml, "FROM debian:bookworm\nWORKDIR /app\nRUN sleep 120\n")
    server = start_server([strict.address], handlers={"harbor": HarborHandler(tmp_path, BASE_MAP, cache)})
    submit(server, "slow", instance=instance("slow"))
    res = result(server, "slow", timeout=300)
    assert res["status"] == "failed" and res["error"]["stage"] == "init", res
    message = res["error"]["message"]
    assert f"{tmp_path / 'slow' / 'environment' / 'Dockerfile'}:3: RUN failed the build" in message
    assert "killed after 15 s" in message
    assert not [p for p in cache.glob("dockerfile-*.sif") if "sleep 120" in p.with_suffix(".json").read_text()]


def test_a_bad_task_is_refused_at_submission_naming_the_file(start_server, strict, tmp_path):
    task_folder(tmp_path, "gpu", TOML + "gpus = 1\n")
    server = start_server([strict.address], handlers={"harbor": HarborHandler(tmp_path, BASE_MAP, tmp_path)})
    answer = server.http.post("/jobs", json={"job_id": "g", "instance": instance("gpu")})
    assert answer.status_code == 400, answer.text
    assert f"{tmp_path / 'gpu' / 'task.toml'}: environment.gpus: this server gives sandboxes no GPUs" in answer.text


@pytest.mark.parametrize(
    ("toml", "dockerfile", "match"),
    [
        (TOML + "cpu = 2\n", None, r"task\.toml: environment\.cpu: unknown field"),
        (TOML + 'cpus = "two"\n', None, r"task\.toml: environment\.cpus: Input should be a valid integer"),
        (TOML + 'memory_mb = 512\nmemory = "1G"\n', None, r"environment: Value error, give memory_mb or memory"),
        (TOML + 'memory = "lots"\n', None, r"memory = 'lots' is not a size"),
        ("artifacts = ['/app']\n" + TOML, None, r"task\.toml: artifacts: not supported here"),
        (TOML + "[verifier]\nuser = 'root'\n", None, r"task\.toml: verifier\.user: unknown field"),
        (TOML.replace("[agent]\n", "[agent]\nenv = 1\n"), None, r"agent\.env: unknown field"),
        (TOML + "[verifier.env]\nKEY = '${HOST_KEY}'\n", None, r"verifier\.env: .*host variables"),
        ("version = [\n", None, r"task\.toml: Invalid value"),
        (TOML, "FROM debian:bookworm\n", r"Dockerfile: WORKDIR / cannot be the agent's working directory"),
        (TOML, 'FROM debian:bookworm\nWORKDIR /app\nSHELL ["/bin/bash"]\n', r"Dockerfile:3: SHELL: not supported"),
    ],
)
def test_task_toml_and_dockerfile_errors_name_the_file_and_field_or_line(tmp_path, toml, dockerfile, match):
    task_folder(tmp_path, "t", toml, dockerfile or "FROM debian:bookworm\nWORKDIR /app\n")
    with pytest.raises(ValueError, match=match):
        HarborHandler(tmp_path, BASE_MAP, tmp_path).validate_instance(instance("t"))


def test_old_sizes_and_harbor_1_1_fields_are_read(tmp_path):
    toml = (
        'schema_version = "1.1"\n[task]\nname = "org/t"\nkeywords = ["x"]\n[[task.authors]]\nname = "A"\n'
        '[metadata]\nanything = {goes = 1}\n[environment]\nmemory = "1.5G"\nstorage = "512M"\ncpus = 2\n'
        'docker_image = "org/t:1"\nallow_internet = true\nmcp_servers = []\ngpus = 0\n[environment.env]\n'
        '[solution.env]\nA = "1"\n'
    )
    task_folder(tmp_path, "t", toml)
    config = load_task(tmp_path, "t").config
    assert (config.environment.memory_mb, config.environment.storage_mb, config.environment.cpus) == (1536, 512, 2)
    assert config.schema_version == "1.1" and config.solution.env == {"A": "1"} and config.agent.timeout_sec == 600


@pytest.mark.parametrize(
    ("name", "match"),
    [
        ("../etc", "is not a task name"),
        ("/etc", "is not a task name"),
        ("t/../../etc", "is not a task name"),
        (".hidden", "is not a task name"),
        ("escape", "leads outside the tasks directory"),
        ("missing", "no task 'missing'"),
    ],
)
def test_a_task_name_is_a_folder_under_the_tasks_directory_and_nothing_else(tmp_path, name, match):
    tasks = tmp_path / "tasks"
    task_folder(tasks, "t")
    task_folder(tmp_path, "outside")
    (tasks / "escape").symlink_to(tmp_path / "outside")
    with pytest.raises(TaskError, match=match):
        HarborHandler(tasks, BASE_MAP, tmp_path).validate_instance(instance(name))


def test_a_missing_file_is_named_and_the_oracle_needs_a_solution(tmp_path):
    handler = HarborHandler(tmp_path, BASE_MAP, tmp_path)
    path = task_folder(tmp_path, "t")
    shutil.rmtree(path / "solution")
    handler.validate_instance(instance("t"))
    with pytest.raises(TaskError, match=r"solution/solve\.sh is missing"):
        handler.validate_instance(instance("t", agent="oracle"))
    (path / "tests" / "test.sh").unlink()
    with pytest.raises(TaskError, match=r"tests/test\.sh is missing"):
        handler.validate_instance(instance("t"))


def test_without_a_tasks_directory_every_instance_is_refused(monkeypatch):
    monkeypatch.delenv("PRORL_HARBOR_TASKS", raising=False)
    with pytest.raises(ValueError, match="PRORL_HARBOR_TASKS"):
        HarborHandler().validate_instance(instance("count-lines"))

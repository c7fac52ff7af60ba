"""Judging a program on hidden tests: `runner.py` runs it in a sandbox, the host compares the outputs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, TypeAdapter

from prorl_server.sandbox import Sandbox
from prorl_server.tool_server.errors import ToolError

RUNNER_SOURCE = Path(__file__).with_name("runner.py")
RUNNER_PATH, CONFIG_PATH, RESULTS_PATH = "/tmp/prorl_runner.py", "/tmp/prorl_inputs.json", "/tmp/prorl_results.json"
KIND = {"time_limit": "time limit", "memory_limit": "memory limit", "runtime_error": "runtime error"}


class Run(BaseModel):
    """What `runner.py` recorded of one run."""

    status: Literal["ok", "time_limit", "memory_limit", "runtime_error", "skipped"]
    stdout: str
    stderr: str
    exit_code: int | None
    seconds: float


RUNS = TypeAdapter(list[Run])


def same_output(actual: str, expected: str) -> bool:
    """Equal once trailing whitespace is stripped from every line and trailing empty lines are dropped."""

    def lines(text: str) -> list[str]:
        return [line.rstrip() for line in text.rstrip().splitlines()]

    return lines(actual) == lines(expected)


async def judge(
    sandbox: Sandbox,
    program: str,
    tests: list[dict[str, str]],
    *,
    time_limit_s: float = 2.0,
    memory_mb: int = 256,
    path: str = "/workspace/solution.py",
) -> dict[str, Any]:
    """Write `program` to `path` in `sandbox` and run it on every test.

    Returns {"passed", "total", "failure"}; failure is None or, for the first failing test, {"test" (its
    index), "kind" (wrong answer, time limit, memory limit or runtime error), "seconds", "stderr" (the end)}.
    A program that breaks the runner or the sandbox fails every test with a runtime error.
    """
    keep_bytes = max(len(t["stdout"].encode()) for t in tests) + 1024
    config = {"program": path, "inputs": [t["stdin"] for t in tests], "time_limit_s": time_limit_s,
              "memory_mb": memory_mb, "keep_bytes": keep_bytes, "results": RESULTS_PATH}  # fmt: skip
    await sandbox.write_file(path, program)
    await sandbox.write_file(RUNNER_PATH, RUNNER_SOURCE.read_text(encoding="utf-8"))
    await sandbox.write_file(CONFIG_PATH, json.dumps(config))
    try:
        runs = await _run(sandbox, len(tests) * (time_limit_s + 1) + 30)
        if len(runs) != len(tests):
            raise ValueError(f"{len(runs)} results for {len(tests)} tests")
    except (ToolError, ValueError) as exc:
        stderr = f"the judge was disrupted: {exc}"[:500]
        return {"passed": 0, "total": len(tests), "failure": {"test": 0, "kind": "runtime error", "stderr": stderr}}
    passed, failure = 0, None
    for i, (test, run) in enumerate(zip(tests, runs, strict=True)):
        if run.status == "ok" and same_output(run.stdout, test["stdout"]):
            passed += 1
        elif failure is None:
            kind = KIND.get(run.status, "wrong answer")
            failure = {"test": i, "kind": kind, "seconds": run.seconds, "stderr": run.stderr[-500:]}
    return {"passed": passed, "total": len(tests), "failure": failure}


async def _run(sandbox: Sandbox, timeout: float) -> list[Run]:
    result = await sandbox.bash(f"python3 {RUNNER_PATH} {CONFIG_PATH}", timeout=timeout, kind="tests")
    if result.exit_code != 0:
        raise ValueError(f"the test runner ended with {result.exit_code}: {result.output[-300:]}")
    return RUNS.validate_json(await sandbox.read_file(RESULTS_PATH))

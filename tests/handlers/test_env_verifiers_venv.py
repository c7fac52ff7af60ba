"""The verifiers handler's tests (test_env_verifiers.py), run in the venv of scripts/setup-verifiers.sh.

verifiers 0.4 pins openai<3 and the tests' .venv has openai 3, so verifiers cannot be installed beside the rest of
the suite. This test runs that module in verifiers' own venv as a nested pytest (`<venv>/bin/python -m pytest
tests/handlers/test_env_verifiers.py`, from the repository's root) and passes only when all of it passed:
nothing failed, errored or skipped. The nested run gets PRORL_VERIFIERS_NESTED=1, under which the module fails
where verifiers does not import, instead of skipping as it does in this venv. Where that venv is missing this
test skips, saying how to make it; with PRORL_REQUIRE_VERIFIERS=1 (scripts/test.sh) it fails instead. Where
verifiers imports in this process (that venv's own run, or a developer's venv with the `verifiers` extra), the
module's tests run directly and this one skips rather than start them again.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
from pathlib import Path

import pytest
from repo_paths import REPO

REQUIRE_VERIFIERS_ENV = "PRORL_REQUIRE_VERIFIERS"
NESTED_ENV = "PRORL_VERIFIERS_NESTED"  # read by test_env_verifiers.py
MODULE = "tests/handlers/test_env_verifiers.py"
NESTED_TIMEOUT_S = 450  # 30-40 s on 2 shared cores; under pytest-timeout's 600 s, so the output is still shown
# pytest -q's closing line: "25 passed in 30.15s", "1 failed, 24 passed, 2 warnings in 31.02s (0:00:31)", ...
SUMMARY = re.compile(r"^(?:=+ )?((?:\d+ \w+, )*\d+ \w+) in [\d.]+s\b", re.MULTILINE)


def outcomes(output: str) -> dict[str, int]:
    """The counts of pytest -q's closing line but its warnings: {"passed": 25}, {"failed": 1, "passed": 24}."""
    summaries = SUMMARY.findall(output)
    parts = [part.split(" ") for part in summaries[-1].split(", ")] if summaries else []
    return {word: int(n) for n, word in parts if word not in ("warning", "warnings")}


def verifiers_home() -> Path:
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return Path(os.environ.get("PRORL_VERIFIERS_HOME") or cache / "prorl-server" / "verifiers")


@pytest.fixture
def verifiers_python() -> Path:
    try:
        import verifiers.v1  # noqa: F401
    except ImportError:
        pass
    else:
        pytest.skip("verifiers is importable here: its tests run directly (test_env_verifiers.py)")
    venv = verifiers_home() / "venv"
    python = venv / "bin" / "python"
    if not list(venv.glob(".prorl-installed-verifiers-*")) or not python.exists():
        problem = f"verifiers is not installed in {venv} (bash scripts/setup-verifiers.sh)"
        if os.environ.get(REQUIRE_VERIFIERS_ENV) == "1":
            pytest.fail(f"{REQUIRE_VERIFIERS_ENV}=1 but {problem}")
        pytest.skip(problem)
    return python


def test_the_verifiers_tests_pass_in_verifiers_own_venv(verifiers_python):
    # this checkout's code whatever checkout the venv was made from; none of this run's pytest options
    env = {name: value for name, value in os.environ.items() if not name.startswith("PYTEST_")}
    env |= {NESTED_ENV: "1", "PYTHONPATH": os.pathsep.join([str(REPO / "src"), str(REPO / "handlers" / "src")])}
    command = [str(verifiers_python), "-m", "pytest", MODULE, "-p", "no:cacheprovider", "-q"]
    with subprocess.Popen(
        command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    ) as nested:
        try:
            output, _ = nested.communicate(timeout=NESTED_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            os.killpg(nested.pid, signal.SIGKILL)
            output, _ = nested.communicate()
            pytest.fail(f"`{' '.join(command)}` took over {NESTED_TIMEOUT_S} s; its output:\n{output[-10_000:]}")
    shown = f"`{' '.join(command)}` exited {nested.returncode}; its output:\n{output[-10_000:]}"
    assert nested.returncode == 0, shown
    counts = outcomes(output)
    defined = len(re.findall(r"^(?:async )?def test_", (REPO / MODULE).read_text(), re.MULTILINE))
    assert set(counts) == {"passed"} and counts["passed"] >= defined, shown  # no skip, xfail, deselection

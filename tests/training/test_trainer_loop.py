"""examples/trainer_loop.py end to end: the dev engine and a prorl-server as child processes, two small steps."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys

import pytest
from repo_paths import EXAMPLES

EXAMPLE = EXAMPLES / "trainer_loop.py"

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("llama_cpp") is None, reason="the dev engine needs llama-cpp-python (the devllm extra)"
)


def test_two_steps_print_the_table_and_exit_0():
    argv = [sys.executable, str(EXAMPLE), "--engine", "dev", "--steps", "2", "--groups", "1", "--in-flight", "3"]
    done = subprocess.run(
        argv, capture_output=True, text=True, timeout=150, env={**os.environ, "PYTHONUNBUFFERED": "1"}
    )
    out = done.stdout

    assert done.returncode == 0, out + done.stderr
    header = next(line for line in out.splitlines() if line.split()[:3] == ["step", "version", "launched"])
    assert "informative" in header and "wasted" in header and "seen versions" in header
    rows = [line.split() for line in out.splitlines() if re.match(r"\s*[01]\s+\d->\d\s", line)]
    assert [r[:2] for r in rows] == [["0", "0->1"], ["1", "1->2"]]
    for cells in rows:
        launched, informative, filtered = int(cells[2]), int(cells[3]), int(cells[4])
        assert informative == 1 and launched >= 1 and filtered >= 0
        assert 0.0 < float(cells[8]) < 1.0  # an informative group's mean reward
        assert float(cells[9]) > 0.0  # and its advantages are not all zero
        assert any(re.fullmatch(r"v\dx\d+", cell) for cell in cells[11:])  # turns carry a weight version
    assert rows[0][11].startswith("v0")  # step 0 sampled under the initial version 0
    assert "trainer loop done" in out
    assert "stopping 2 child process(es)" in out

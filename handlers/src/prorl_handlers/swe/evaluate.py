"""Scoring a patch like SWE-bench: apply it and the test patch to a fresh checkout, run the instance's tests."""

from __future__ import annotations

import re
import shlex
from typing import Any

from prorl_handlers.swe.instance import SWEInstance
from prorl_server.sandbox import Sandbox

PATCHED_FILE = re.compile(r"^diff --git a/\S+ b/(\S+)$", re.MULTILINE)
# pytest's `-rA` summary: its header, lines that are not section rules, and the final "=== ... in 0.1s ===" rule
# ending the log. Anchored there, output of the tests themselves (captured sections come before it) never counts.
SUMMARY = re.compile(r"^=+ short test summary info =+\n((?:[^=\n].*\n)*)=+ .* =+\n?\Z", re.MULTILINE)
LOG_FILE = "/tmp/prorl-swe-tests.log"
LOG_TAIL_CHARS = 4000
APPLY_TIMEOUT_S = 60.0
# The sandbox's Python may carry many pytest plugins (bubblewrap binds the host's virtualenv); loading them
# costs seconds per run and the repositories need none.
PYTEST = "PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 python3 -m pytest -rA --tb=short -p no:cacheprovider"


async def evaluate(sandbox: Sandbox, task: SWEInstance, patch: str, timeout: float) -> dict[str, Any]:
    """Reward 1.0 when every FAIL_TO_PASS and PASS_TO_PASS test passes with `patch`, else 0.0 and why.

    The checkout at `task.workdir` must be at base_commit. As in SWE-bench, the files the test patch touches
    are reset to base_commit (the model may have edited them) before it is applied.
    """
    workdir = shlex.quote(task.workdir)
    error = await _apply(sandbox, workdir, patch)
    if error is not None:
        return {"reward": 0.0, "patch_applied": False, "error": f"the model patch does not apply: {error}"}
    files = " ".join(shlex.quote(name) for name in PATCHED_FILE.findall(task.test_patch))
    base = shlex.quote(task.base_commit)
    reset = f'cd {workdir} && for f in {files}; do git checkout -q {base} -- "$f" 2>/dev/null || rm -f -- "$f"; done'
    error = await _apply(sandbox, workdir, task.test_patch, reset)
    if error is not None:
        return {"reward": 0.0, "patch_applied": True, "error": f"the test patch does not apply: {error}"}

    test_files = sorted({test.split("::", 1)[0] for test in task.fail_to_pass + task.pass_to_pass})
    run = await sandbox.bash(
        f"cd {workdir} && {PYTEST} {' '.join(map(shlex.quote, test_files))} > {LOG_FILE} 2>&1",
        timeout=timeout,
        kind="tests",  # its own duration model in the action scheduler
    )
    log = await sandbox.read_file(LOG_FILE)
    summary = SUMMARY.search(log)
    lines = summary.group(1).splitlines() if summary else []
    passed = {line.removeprefix("PASSED ") for line in lines if line.startswith("PASSED ")}
    fail_to_pass = [test for test in task.fail_to_pass if test not in passed]
    pass_to_pass = [test for test in task.pass_to_pass if test not in passed]
    reward = 0.0 if fail_to_pass or pass_to_pass else 1.0
    details = {
        "reward": reward,
        "patch_applied": True,
        "FAIL_TO_PASS_failed": fail_to_pass,
        "PASS_TO_PASS_failed": pass_to_pass,
        "tests_timed_out": run.timed_out,
    }
    if not reward:
        details["test_log"] = log[-LOG_TAIL_CHARS:]
    return details


async def _apply(sandbox: Sandbox, workdir: str, patch: str, before: str = "true") -> str | None:
    """Run `before`, then `git apply` the patch in the checkout; None when it applied, else git's message."""
    if not patch.strip():
        return None
    await sandbox.write_file("/tmp/prorl-swe-apply.patch", patch)
    done = await sandbox.bash(
        f"{before}; git -C {workdir} apply --whitespace=nowarn /tmp/prorl-swe-apply.patch", timeout=APPLY_TIMEOUT_S
    )
    return None if done.exit_code == 0 else done.output.strip()[-1000:] or f"git apply exited with {done.exit_code}"

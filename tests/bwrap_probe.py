"""Whether a plain bwrap command line runs here (tests that drive bwrap directly skip with the reason)."""

from __future__ import annotations

import functools
import shutil
import subprocess


@functools.cache
def bwrap_reason(*options: str) -> str | None:
    """None if `bwrap OPTIONS true` succeeds, else why not."""
    binary = shutil.which("bwrap")
    if binary is None:
        return "bubblewrap is not installed"
    done = subprocess.run([binary, *options, "true"], capture_output=True, text=True, timeout=30)
    return None if done.returncode == 0 else f"bwrap cannot run here: {done.stderr.strip()}"

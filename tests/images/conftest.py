"""The local base image the image-build tests of this folder build on.

`base` is the first of BASES that exists (made by scripts/setup-apptainer.sh: a Debian bookworm root with
python3, and the tests' image); a test taking it is skipped with the reason when apptainer or the base is
missing.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from prorl_server.sandbox.apptainer import ENV_BINARY, find_apptainer

BASES = (Path("/tmp/apptainer-test/imgroot"), Path("/tmp/apptainer-test/images/py.sif"))


@pytest.fixture(scope="module")
def base() -> Path:
    """The local base image of scripts/setup-apptainer.sh (skips without apptainer or a base)."""
    if find_apptainer() is None:
        pytest.skip(f"needs apptainer (PATH or {ENV_BINARY}); as root: bash scripts/setup-apptainer.sh")
    found = next((b for b in BASES if b.exists()), None)
    if found is None:
        pytest.skip(f"needs a base image, one of {[str(b) for b in BASES]}: bash scripts/setup-apptainer.sh")
    return found

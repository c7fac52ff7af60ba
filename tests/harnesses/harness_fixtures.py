"""Shared by the harness tests: `harness_installed(name)` gives the install directory of a preset (installing
it, pinned, under `$PRORL_HARNESS_ROOT` the first time), or skips where its package client is missing; with
`PRORL_REQUIRE_HARNESSES=1` (set by scripts/test.sh, which installs them all) a missing harness fails
instead. `external_agent_server` starts the server they run on, `command_lines` finds a harness's processes."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import pytest
from prorl_handlers.external_agent import ExternalAgentHandler
from prorl_handlers.harnesses import HARNESSES, HarnessInstallError, install, installed

REQUIRE_ENV = "PRORL_REQUIRE_HARNESSES"
CONTEXT = 200_000
"""The scripted double's context for a harness: its tokenizer has one token per character, and a harness's
first prompt is up to ~50,000 characters."""


def harness_installed(name: str) -> Path:
    """The install directory of preset `name` (installed now if it is not)."""
    harness = HARNESSES[name]
    directory = installed(harness)
    if directory is not None:
        return directory
    client = "npm" if harness.package.ecosystem == "npm" else None
    if client is not None and shutil.which(client) is None and os.environ.get(REQUIRE_ENV) != "1":
        pytest.skip(f"harness {name}: {client} is not installed here, so {harness.package.spec} cannot be")
    try:
        return install(harness)
    except HarnessInstallError as exc:
        if os.environ.get(REQUIRE_ENV) == "1":
            pytest.fail(f"{REQUIRE_ENV}=1 but harness {name} cannot be installed: {exc}")
        pytest.skip(f"harness {name} cannot be installed here: {exc}")


def external_agent_server(start_server: Any, backend: Any) -> Any:
    """A test server running `external_agent` under bubblewrap on `backend`, whose sandboxes reach its gateway
    at the free port it was given."""
    server = start_server([backend.address], handlers={"external_agent": ExternalAgentHandler()}, runtime="bwrap")
    server.state.gateway.public_url = server.url
    return server


def command_lines(*markers: str) -> list[str]:
    """The command lines (arguments joined by spaces) of this machine's processes holding any of `markers`."""
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            text = cmdline.read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:  # the process ended meanwhile
            continue
        if any(marker in text for marker in markers):
            found.append(text)
    return found

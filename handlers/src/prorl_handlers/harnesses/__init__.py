"""Harness presets: the agent programs people train, run unmodified in a sandbox against a gateway session.

An `external_agent` instance with `"harness": NAME` and a `"task"` runs that program (docs/harnesses.md), and
so does a `harbor` instance with `"agent": "harness"` on its task's instruction: installed once per server
machine, pinned (`python -m prorl_handlers.harnesses install NAME`), bound read-only into the sandbox at
`HARNESS_MOUNT`, pointed at the job's session by the variables and config files it reads, with telemetry,
auto-update and every outside host off (`sandbox.harness_sandbox`, which both handlers call). Each preset is
one small `Harness` subclass; `HARNESSES` has them by name.
"""

from prorl_handlers.harnesses.base import HARNESS_MOUNT, Dialect, Harness, HarnessRun, Package
from prorl_handlers.harnesses.claude_code import ClaudeCode
from prorl_handlers.harnesses.codex import Codex
from prorl_handlers.harnesses.install import (
    HarnessInstallError,
    HarnessNotInstalled,
    harness_root,
    install,
    install_record,
    installed,
    require_installed,
)
from prorl_handlers.harnesses.mini_swe_agent import MiniSweAgent
from prorl_handlers.harnesses.opencode import OpenCode
from prorl_handlers.harnesses.terminus import Terminus

HARNESSES: dict[str, type[Harness]] = {
    harness.name: harness for harness in (ClaudeCode, Codex, MiniSweAgent, OpenCode, Terminus)
}
"""The presets by name."""

__all__ = [
    "HARNESSES",
    "HARNESS_MOUNT",
    "Dialect",
    "Harness",
    "HarnessInstallError",
    "HarnessNotInstalled",
    "HarnessRun",
    "Package",
    "harness_root",
    "install",
    "install_record",
    "installed",
    "require_installed",
]

"""A harness in a sandbox, for every handler that runs one (`external_agent`, `harbor`): `harness_sandbox()`
turns a handler's own sandbox spec into one with the harness's install bound read-only at `HARNESS_MOUNT`
(and what the install needs of the host: a PyPI harness's Python), HOME and the preset's variables set and
the address-space limit raised to the preset's `memory_mb`, and gives the config files to write and the
command to run; `HarnessSandbox.prepare()` writes them into the started sandbox, and `report()` says what
the harness left (the files it changed, the ends of its logs)."""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from typing import Any

from prorl_handlers.harnesses import HARNESS_MOUNT, HARNESSES, Harness, HarnessRun, require_installed
from prorl_server.gateway import PLACEHOLDER_KEY, gateway_env
from prorl_server.handlers import GatewayAccess
from prorl_server.sandbox import HOST_SYSTEM, Bind, Sandbox, SandboxSpec

HOME = "/tmp/harness-home"
START_MARK = "/tmp/.prorl-harness-start"
LOG_TAIL_CHARS = 4000
MAX_CHANGED_FILES = 1000
SETUP_TIMEOUT_S = 30.0


def session_defaults(name: str) -> dict[str, Any]:
    """The gateway session options harness `name` wants (`model`, `accept_any_model`) unless a job sets them."""
    harness = HARNESSES[name]
    return {"model": harness.model, "accept_any_model": harness.accept_any_model}


@dataclass(frozen=True)
class HarnessSandbox:
    """One harness run: the sandbox to start (`spec`, with the job's gateway session), the files `prepare()`
    writes into it, and the bash `command` that runs the harness in its working directory."""

    harness: Harness
    run: HarnessRun
    spec: SandboxSpec
    files: dict[str, str]
    command: str

    async def prepare(self, sandbox: Sandbox) -> None:
        """Make HOME and the start mark (`report()`'s changed files are newer), and write the config files."""
        await sandbox.bash(f"mkdir -p {shlex.quote(self.run.home)} && touch {START_MARK}", timeout=SETUP_TIMEOUT_S)
        for path, text in self.files.items():
            await sandbox.bash(f"mkdir -p -- {shlex.quote(path.rsplit('/', 1)[0] or '/')}", timeout=SETUP_TIMEOUT_S)
            await sandbox.write_file(path, text)

    async def report(self, sandbox: Sandbox) -> dict[str, Any]:
        """What the harness left: the files it changed in the working directory and the ends of its own logs."""
        listing = await sandbox.bash(
            f"cd {shlex.quote(self.run.workdir)} && find . -newer {START_MARK} -type f -printf '%P\\n' 2>/dev/null"
            f" | sort | head -n {MAX_CHANGED_FILES}",
            timeout=60,
        )
        logs: dict[str, str] = {}
        for name in self.harness.log_paths:
            # the preset's own path, which may be a glob (a log named by date or session)
            tail = await sandbox.bash(f"cat -- {self.run.home}/{name} 2>/dev/null | tail -c {LOG_TAIL_CHARS}", 30)
            if tail.exit_code == 0 and tail.output:
                logs[name] = tail.output
        return {
            "name": self.harness.name,
            "package": self.harness.package.spec,
            "changed_files": [line for line in listing.output.splitlines() if line],
            "logs": logs,
        }


def harness_sandbox(name: str, base: SandboxSpec, task: str, access: GatewayAccess, max_turns: int) -> HarnessSandbox:
    """Harness `name` (installed: else HarnessNotInstalled) on `task` in a sandbox like `base`, in its working
    directory, asking the session of `access` for its model in at most `max_turns` model calls (where it has
    the setting), told the backend's context length where the session knows it."""
    harness_class = HARNESSES[name]
    directory = require_installed(harness_class)
    harness = harness_class()
    model = access.model
    inside = gateway_env(model)
    run = HarnessRun(
        task=task,
        model=model,
        base_url=inside["ANTHROPIC_BASE_URL"] if harness.dialect == "anthropic" else inside["OPENAI_BASE_URL"],
        api_key=PLACEHOLDER_KEY,
        max_turns=max_turns,
        workdir=base.workdir,
        home=HOME,
        context_tokens=access.context_tokens,
    )
    binds = [Bind(source=str(directory), target=HARNESS_MOUNT, read_only=True)]
    # what the install needs where the host has it (its Python), unless the sandbox has the host's copy
    binds += [
        Bind(source=path, target=path, read_only=True)
        for path in harness.binds(directory)
        if path.split("/")[1] not in HOST_SYSTEM
    ]
    env = {**base.env, "HOME": run.home, **harness.env(run)}
    limits = base.limits  # raised to the address space the harness needs (`Harness.memory_mb`), never lowered
    if harness.memory_mb is not None and limits.memory_mb is not None and limits.memory_mb < harness.memory_mb:
        limits = limits.model_copy(update={"memory_mb": harness.memory_mb})
    spec = base.model_copy(update={"binds": [*base.binds, *binds], "env": env, "limits": limits})
    command = f"cd {shlex.quote(run.workdir)} && {harness.command(run)}"
    return HarnessSandbox(harness, run, spec, harness.files(run), command)

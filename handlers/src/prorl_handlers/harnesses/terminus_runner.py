"""Run Harbor's Terminus-2, unmodified, on this machine: the runner the `terminus` preset writes into its sandbox.

Harbor's trial runner starts an environment (a container), builds the agent with a logs directory, runs
`agent.setup(environment)` and `agent.run(instruction, environment, AgentContext())`, and stops the
environment. This does the same with `LocalEnvironment`, harbor's `BaseEnvironment` for the machine this
runs on: `exec` is a bash process in the working directory (the agent's tmux server among them), files are
copied, and the environment's `/logs/agent` is the trial's agent directory, as a mounted container's is.
Run by the harness's own Python (>= 3.12) with one argument, the JSON file `Terminus.files` writes.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path, PurePosixPath
from typing import Any

from harbor.agents.terminus_2 import Terminus2
from harbor.environments.base import BaseEnvironment, ExecResult
from harbor.models.agent.context import AgentContext
from harbor.models.task.config import EnvironmentConfig
from harbor.models.trial.paths import EnvironmentPaths, TrialPaths

SESSION_ID = "prorl-terminus"


class LocalEnvironment(BaseEnvironment):
    """This machine as harbor's environment: commands run here, in `workdir`, as the current user."""

    def __init__(self, workdir: Path, trial_paths: TrialPaths) -> None:
        self.workdir = workdir
        super().__init__(
            environment_dir=workdir,
            environment_name="local",
            session_id=SESSION_ID,
            trial_paths=trial_paths,
            task_env_config=EnvironmentConfig(),
        )

    @staticmethod
    def type() -> str:
        """The environment type."""
        return "prorl-local"

    def _validate_definition(self) -> None:
        """Nothing to validate: there is no definition to build."""

    async def start(self, force_build: bool) -> None:
        """Nothing to start: this machine is running."""

    async def stop(self, delete: bool) -> None:
        """End the agent's tmux server, which outlives the commands that started it."""
        await self.exec("tmux kill-server 2>/dev/null || true", timeout_sec=10)

    async def upload_file(self, source_path: Path | str, target_path: str) -> None:
        """Copy a file."""
        Path(target_path).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source_path, target_path)

    async def upload_dir(self, source_dir: Path | str, target_dir: str) -> None:
        """Copy a directory."""
        shutil.copytree(source_dir, target_dir, dirs_exist_ok=True)

    async def download_file(self, source_path: str, target_path: Path | str) -> None:
        """Copy a file."""
        await self.upload_file(source_path, str(target_path))

    async def download_dir(self, source_dir: str, target_dir: Path | str) -> None:
        """Copy a directory."""
        await self.upload_dir(source_dir, str(target_dir))

    async def exec(
        self,
        command: str,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        timeout_sec: int | None = None,
        user: str | int | None = None,
    ) -> ExecResult:
        """`command` run by bash in `cwd` (default: the working directory); `user` is ignored, as the sandbox
        has one. A timeout kills its process group and raises RuntimeError, as harbor's Docker environment."""
        process = await asyncio.create_subprocess_exec(
            "bash",
            "-c",
            command,
            cwd=cwd or self.workdir,
            env={**os.environ, **(self._merge_env(env) or {})},
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        try:
            stdout, stderr = await asyncio.wait_for(process.communicate(), timeout_sec)
        except TimeoutError:
            os.killpg(process.pid, signal.SIGKILL)
            await process.wait()
            raise RuntimeError(f"Command timed out after {timeout_sec} seconds") from None
        return ExecResult(
            stdout=stdout.decode(errors="replace") or None,
            stderr=stderr.decode(errors="replace") or None,
            return_code=process.returncode or 0,
        )


def model_info(context_tokens: int | None) -> dict[str, Any] | None:
    """litellm's record of the session's model, so that Terminus summarizes before the context is full (without
    one it assumes 1M tokens); free, since litellm has no price for it. None when the context is not known."""
    if context_tokens is None:
        return None
    return {
        "max_input_tokens": context_tokens,
        "max_output_tokens": context_tokens // 4,
        "input_cost_per_token": 0.0,
        "output_cost_per_token": 0.0,
        "cache_creation_input_token_cost": 0.0,  # given, so that litellm does not warn of them on stdout
        "cache_read_input_token_cost": 0.0,
        "litellm_provider": "openai",
        "mode": "chat",
    }


async def run(config: dict[str, Any]) -> dict[str, Any]:
    """Terminus-2 on `config["task_file"]`'s task, as harbor's trial runs it; returns what it reports."""
    trial_paths = TrialPaths(trial_dir=Path(config["trial_dir"]))
    trial_paths.mkdir()
    # The environment's /logs/agent (the tmux pane's log) is the trial's agent directory, as when mounted.
    EnvironmentPaths.agent_dir = PurePosixPath(trial_paths.agent_dir)
    environment = LocalEnvironment(Path.cwd(), trial_paths)
    agent = Terminus2(
        logs_dir=trial_paths.agent_dir,
        model_name=f"openai/{config['model']}",
        api_base=config["api_base"],
        max_turns=config["max_turns"],
        suppress_max_turns_warning=True,
        record_terminal_session=False,  # asciinema: not installed, nor installable offline
        llm_kwargs={"api_key": config["api_key"]},
        model_info=model_info(config["context_tokens"]),
    )
    agent.session_id = SESSION_ID
    context = AgentContext()
    await environment.start(force_build=False)
    try:
        await agent.setup(environment=environment)
        await agent.run(instruction=Path(config["task_file"]).read_text(), environment=environment, context=context)
    finally:
        await environment.stop(delete=True)
    return {
        "n_input_tokens": context.n_input_tokens,
        "n_output_tokens": context.n_output_tokens,
        **(context.metadata or {}),
    }


def main() -> int:
    """Run on the config file named by the first argument; print what Terminus-2 reports, as JSON."""
    config = json.loads(Path(sys.argv[1]).read_text())
    # harbor's loggers are at DEBUG already; litellm's (which prints its own) from warnings on
    logging.basicConfig(filename=config["log_file"], level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("LiteLLM").setLevel(logging.WARNING)
    print(json.dumps(asyncio.run(run(config))), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""`terminus`: Harbor's Terminus-2 (PyPI `harbor`), the agent that works a task through keystrokes to a tmux
session, asking the model in a JSON format of its own (`analysis`, `plan`, `commands`, `task_complete`).

Harbor runs Terminus-2 outside a container and drives the container's tmux through an environment object;
here it runs inside the sandbox, unmodified, by `terminus_runner.py` (written to the harness's HOME), whose
environment is the sandbox itself. It calls the model through litellm, as `openai/<model>` at the session's
`/v1`; litellm's model price map is its bundled copy and its telemetry, like harbor's, is off.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import ClassVar

from prorl_handlers.harnesses.base import Dialect, Harness, HarnessRun, Package

RUNNER = Path(__file__).with_name("terminus_runner.py")
QUIET = {
    "LITELLM_LOCAL_MODEL_COST_MAP": "True",  # else litellm fetches its price map at import
    "LITELLM_TELEMETRY": "False",
    "HARBOR_TELEMETRY": "0",
    "DO_NOT_TRACK": "1",
    "PYTHONDONTWRITEBYTECODE": "1",  # the install is read-only
}


class Terminus(Harness):
    """Harbor's Terminus-2, in the sandbox, on a tmux session of its own in the working directory."""

    name = "terminus"
    dialect: ClassVar[Dialect] = "chat"
    package = Package("pypi", "harbor", "0.26.0", python="3.12")
    context_tokens = 700  # its prompt template and the first screen: 671 tokens by gpt-4o's tokenizer, + the task
    log_paths = ("terminus.log", "trial/agent/terminus_2.pane")

    def env(self, run: HarnessRun) -> dict[str, str]:
        """litellm and harbor without outside calls."""
        return dict(QUIET)

    def files(self, run: HarnessRun) -> dict[str, str]:
        """The runner, the task, and the runner's config (model, session address, turns, where to log)."""
        config = {
            "model": run.model,
            "api_base": run.base_url,
            "api_key": run.api_key,
            "max_turns": run.max_turns,
            "context_tokens": run.context_tokens,
            "task_file": f"{run.home}/task.md",
            "trial_dir": f"{run.home}/trial",
            "log_file": f"{run.home}/terminus.log",
        }
        return {
            f"{run.home}/terminus_runner.py": RUNNER.read_text(),
            f"{run.home}/task.md": run.task,
            f"{run.home}/terminus.json": json.dumps(config, indent=1),
        }

    def command(self, run: HarnessRun) -> str:
        """The harness's Python on the runner."""
        return f"{run.root}/bin/python {run.home}/terminus_runner.py {run.home}/terminus.json"

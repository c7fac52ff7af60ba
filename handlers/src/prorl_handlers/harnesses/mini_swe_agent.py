"""mini-swe-agent (PyPI mini-swe-agent): OpenAI Chat Completions through litellm, one `bash` tool."""

from __future__ import annotations

import json

from prorl_handlers.harnesses.base import Harness, HarnessRun, Package

CONFIG = "mini-swe-agent/prorl.yaml"
TRAJECTORY = "mini-swe-agent/trajectory.traj.json"


class MiniSweAgent(Harness):
    """mini-swe-agent's `mini` CLI in yolo mode: its default config (`mini.yaml`, tool calls to `bash`), the
    session as an `openai/` litellm model, `max_turns` as its step limit, no cost limit, and no prompt at the
    end (it exits when a command prints `COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT`)."""

    name = "mini_swe_agent"
    dialect = "chat"
    package = Package("pypi", "mini-swe-agent", "2.4.6")
    context_tokens = 800  # its first prompt (mini.yaml's templates, the bash tool): 3,584 of the toy tokenizer's
    log_paths = (TRAJECTORY,)

    def env(self, run: HarnessRun) -> dict[str, str]:
        """Its global config under HOME, no first-run setup; litellm fetches no cost map, catalog or tokenizer."""
        return {
            "MSWEA_GLOBAL_CONFIG_DIR": f"{run.home}/mini-swe-agent",  # its .env, history and default trajectory
            "MSWEA_CONFIGURED": "true",  # skips `mini-extra config setup`'s prompts on the first run
            "LITELLM_LOCAL_MODEL_COST_MAP": "True",  # the bundled cost map, not GitHub's
            "LITELLM_LOCAL_ANTHROPIC_BETA_HEADERS": "True",
            "LITELLM_OFFLINE_MODE": "true",  # no catalog, check or tokenizer litellm would fetch on its own
        }

    def files(self, run: HarnessRun) -> dict[str, str]:
        """The config merged over `mini.yaml`: the model (the session), the step limit, no cost limit, yolo."""
        config = {
            "agent": {
                "mode": "yolo",
                "confirm_exit": False,
                "step_limit": run.max_turns,
                "cost_limit": 0,
            },
            "model": {
                "model_class": "litellm",
                "model_name": f"openai/{run.model}",
                "cost_tracking": "ignore_errors",  # litellm has no price for the session's model
                "model_kwargs": {"api_base": run.base_url, "api_key": run.api_key},
            },
            "environment": {"environment_class": "local", "cwd": run.workdir},
        }
        return {f"{run.home}/{CONFIG}": json.dumps(config, indent=2) + "\n"}  # JSON is YAML

    def command(self, run: HarnessRun) -> str:
        """`mini` on the task with the built-in `mini.yaml` (by its path: a relative name is looked up in the
        working directory first) and the config above, its trajectory under HOME; stdin from /dev/null, so it
        never waits for input."""
        builtin = f"{run.root}/lib/python3*/site-packages/minisweagent/config/mini.yaml"
        return (
            f"{run.root}/bin/python -m minisweagent.run.mini -c {builtin} -c {run.home}/{CONFIG} "
            f"-o {run.home}/{TRAJECTORY} -t {run.quoted_task} < /dev/null"
        )

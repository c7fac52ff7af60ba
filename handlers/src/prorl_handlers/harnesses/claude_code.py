"""Claude Code (npm @anthropic-ai/claude-code, a native binary per platform): `claude -p` on Anthropic Messages."""

from __future__ import annotations

from prorl_handlers.harnesses.base import Harness, HarnessRun, Package

DEBUG_LOG = "claude-debug.txt"


class ClaudeCode(Harness):
    """Claude Code run headless (`claude -p`) with every permission granted, reaching the session alone.

    It reads the session's address, key and model from the gateway's ANTHROPIC_BASE_URL, ANTHROPIC_API_KEY and
    ANTHROPIC_MODEL. Its sub-agents are made to ask for the session's model too (CLAUDE_CODE_SUBAGENT_MODEL, with
    _FORCE overriding an agent's own model and the Agent tool's `model` argument), so they are chains of the
    policy; any other name it sends (its small-model helpers) is a side call, hence `accept_any_model`.
    """

    name = "claude_code"
    dialect = "anthropic"
    package = Package("npm", "@anthropic-ai/claude-code", "2.1.332")
    context_tokens = (
        12_400  # its first prompt (12 tools, ~32k characters of schemas): 48,895 characters, 12.4k SmolLM2 tokens
    )
    log_paths = (DEBUG_LOG,)
    accept_any_model = True

    def env(self, run: HarnessRun) -> dict[str, str]:
        """Permissions skipped even as uid 0; no telemetry, error reports, updates or plugin marketplace; the
        backend's context, where known (else it assumes 1M tokens for a model it does not know)."""
        context = {} if run.context_tokens is None else {"CLAUDE_CODE_MAX_CONTEXT_TOKENS": str(run.context_tokens)}
        return {
            **context,
            "IS_SANDBOX": "1",  # as uid 0 it refuses --dangerously-skip-permissions without it
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
            "DISABLE_TELEMETRY": "1",
            "DISABLE_ERROR_REPORTING": "1",
            "DISABLE_AUTOUPDATER": "1",
            "CLAUDE_CODE_DISABLE_OFFICIAL_MARKETPLACE_AUTOINSTALL": "1",
            "CLAUDE_CODE_SUBAGENT_MODEL": run.model,
            "CLAUDE_CODE_SUBAGENT_MODEL_FORCE": "1",
        }

    def command(self, run: HarnessRun) -> str:
        """`claude -p TASK` with the turn limit, its debug log under HOME, and no permission prompts."""
        return (
            f"{run.root}/node_modules/.bin/claude -p {run.quoted_task} --max-turns {run.max_turns}"
            f" --dangerously-skip-permissions --debug-file {run.home}/{DEBUG_LOG}"
        )

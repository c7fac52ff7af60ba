"""Codex CLI (npm @openai/codex): `codex exec`, speaking OpenAI Responses to the session."""

from __future__ import annotations

import json
import platform

from prorl_handlers.harnesses.base import Harness, HarnessRun, Package

PROVIDER = "prorl"
KEY_ENV = "PRORL_CODEX_API_KEY"
NATIVE = {  # the machine's architecture -> the npm package of Codex's native static binary, and its target
    "x86_64": ("@openai/codex-linux-x64", "x86_64-unknown-linux-musl"),
    "aarch64": ("@openai/codex-linux-arm64", "aarch64-unknown-linux-musl"),
}


class Codex(Harness):
    """OpenAI's Codex CLI, run non-interactively (`codex exec`) with a model provider that is the session.

    It knows no metadata of the session's model, so it runs as for any unknown model: its `exec_command`
    shell tool (unified exec, a command string), `apply_patch` as a command it intercepts and applies
    itself, and, turned on here, its `update_plan` tool. Sub-agents (whose `namespace` tools the gateway
    drops), web search and the bundled skills (which describe outside services) are off; so are plugin and
    app sync, analytics, feedback, OpenTelemetry and the update check, and its endless reconnecting when
    the session is gone. Codex has no turn limit: `max_turns` is not honoured (the time budget is).
    """

    name = "codex"
    dialect = "responses"
    package = Package("npm", "@openai/codex", "0.171.0")
    context_tokens = 7_200  # its first prompt: 30,300 characters (the toy tokenizer's tokens), 7,140 SmolLM2 tokens
    log_paths = (".codex/sessions/*/*/*/rollout-*.jsonl",)

    def env(self, run: HarnessRun) -> dict[str, str]:
        """The key its provider reads (`env_key`), and a TMPDIR of its own beside ~/.codex: with ~/.codex under
        the temporary directory (/tmp) it would not put its helper commands (`apply_patch`) on their PATH."""
        return {KEY_ENV: run.api_key, "TMPDIR": f"{run.home}/tmp"}

    def files(self, run: HarnessRun) -> dict[str, str]:
        """`~/.codex/config.toml`: the session as its model provider, everything outside off."""
        return {f"{run.home}/.codex/config.toml": _config(run)}

    def command(self, run: HarnessRun) -> str:
        """`codex exec` on the task, without a git repository, stdin closed (it would read more from it); the
        native binary itself, not the npm launcher `.bin/codex` (a Node.js script: a task's image may have no
        Node.js)."""
        codex = native_binary(run.root)
        run_it = f"{codex} exec --strict-config --skip-git-repo-check --color never {run.quoted_task} < /dev/null"
        return f'mkdir -p "$TMPDIR" && {run_it}'


def native_binary(root: str) -> str:
    """The path of Codex's static (musl) binary for this machine's architecture in the install at `root`."""
    machine = platform.machine()
    if machine not in NATIVE:
        raise RuntimeError(f"codex: no native binary for this machine's architecture {machine!r}")
    package, target = NATIVE[machine]
    return f"{root}/node_modules/{package}/vendor/{target}/bin/codex"


def _config(run: HarnessRun) -> str:
    """config.toml (`--strict-config` refuses any key this version does not know)."""
    quoted = json.dumps  # a JSON string is a TOML basic string
    # the backend's context, where known: Codex compacts before it is full (else it assumes its fallback's)
    context = "" if run.context_tokens is None else f"\nmodel_context_window = {run.context_tokens}"
    return f"""\
model = {quoted(run.model)}{context}
model_provider = "{PROVIDER}"
approval_policy = "never"
sandbox_mode = "danger-full-access"  # its own sandbox (landlock, seccomp) would nest in ours
check_for_update_on_startup = false
web_search = "disabled"

[model_providers.{PROVIDER}]
name = "prorl-server gateway session"
base_url = {quoted(run.base_url)}
env_key = "{KEY_ENV}"
wire_api = "responses"
supports_websockets = false

[analytics]
enabled = false

[feedback]
enabled = false

[otel]
exporter = "none"
trace_exporter = "none"
metrics_exporter = "none"

[agents]
enabled = false

[skills.bundled]
enabled = false

[tools.update_plan]
enabled = true

[features]
plugins = false
remote_plugin = false
apps = false
unbounded_connection_retries = false
"""

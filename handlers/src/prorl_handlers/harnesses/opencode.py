"""OpenCode (npm `opencode-ai`, a Bun-compiled binary): `opencode run` on Chat Completions.

The session is a custom provider on the bundled `@ai-sdk/openai-compatible` package (nothing is fetched at
run time); its titles go to a small model of another name, so they are side calls with chains of their own.
Its glob and grep tools run ripgrep, which it would otherwise download: `@vscode/ripgrep` is installed beside it.
"""

from __future__ import annotations

import json

from prorl_handlers.harnesses.base import Harness, HarnessRun, Package

PROVIDER = "prorl"
SMALL_MODEL = "opencode-small"
"""The model name of its side calls (session titles), answered by the session as side calls."""
CONTEXT_LIMIT = 131_072
"""The context it is told the model has where the backend does not say (it compacts the conversation near it)."""
OUTPUT_LIMIT = 16_384
"""Its `max_tokens` per call (the gateway cuts it to the room the prompt leaves)."""
VERSION = "1.18.33"
LOOP_AGENTS = ("build", "plan", "general", "explore")
"""Its agents that run a tool loop (`build` the main one, `general` and `explore` its sub-agents)."""


class OpenCode(Harness):
    """OpenCode, non-interactive (`opencode run`, the task on stdin), every permission granted but the web's."""

    name = "opencode"
    dialect = "chat"
    package = Package("npm", "opencode-ai", VERSION)
    extra_packages = (Package("npm", "@vscode/ripgrep", "1.18.0"),)
    context_tokens = 7_500  # its first prompt: 29,838 characters (system prompt, 9 tool schemas)
    log_paths = (".local/share/opencode/log/*.log",)
    memory_mb = 8192  # Bun (JavaScriptCore) reserves tens of GB of address space: it crashes under 4 GB
    accept_any_model = True

    def env(self, run: HarnessRun) -> dict[str, str]:
        """Auto-update, models.dev, LSP downloads, sharing and its built-in auth plugins off."""
        return {
            "OPENCODE_DISABLE_AUTOUPDATE": "1",
            "OPENCODE_DISABLE_MODELS_FETCH": "1",
            "OPENCODE_DISABLE_LSP_DOWNLOAD": "1",
            "OPENCODE_DISABLE_SHARE": "1",
            "OPENCODE_DISABLE_DEFAULT_PLUGINS": "1",
        }

    def files(self, run: HarnessRun) -> dict[str, str]:
        """Its global config (the session as its only provider), and in its config directory a
        `node_modules` and a lock naming `@opencode-ai/plugin`, which it would otherwise `npm install` there
        from the registry at start."""
        context = run.context_tokens or CONTEXT_LIMIT  # it compacts near it
        limit = {"context": context, "output": min(OUTPUT_LIMIT, context // 4)}
        config = {
            "$schema": "https://opencode.ai/config.json",
            "autoupdate": False,
            "share": "disabled",
            "snapshot": False,
            "lsp": False,
            "formatter": False,
            "enabled_providers": [PROVIDER],
            "model": f"{PROVIDER}/policy",
            "small_model": f"{PROVIDER}/small",
            "provider": {
                PROVIDER: {
                    "npm": "@ai-sdk/openai-compatible",
                    "name": "prorl-server gateway",
                    "options": {"baseURL": run.base_url, "apiKey": run.api_key},
                    "models": {
                        "policy": {"id": run.model, "name": run.model, "tool_call": True, "limit": limit},
                        "small": {"id": SMALL_MODEL, "name": SMALL_MODEL, "limit": limit},
                    },
                }
            },
            "permission": {"*": "allow", "webfetch": "deny", "websearch": "deny"},
            "agent": {agent: {"steps": run.max_turns} for agent in LOOP_AGENTS},
        }
        directory = f"{run.home}/.config/opencode"
        plugin = {"@opencode-ai/plugin": VERSION}
        lock = json.dumps({"lockfileVersion": 3, "packages": {"": {"dependencies": plugin}}})
        return {
            f"{directory}/opencode.json": json.dumps(config, indent=2),
            f"{directory}/package.json": json.dumps({"dependencies": plugin}),
            f"{directory}/package-lock.json": lock,
            f"{directory}/node_modules/.package-lock.json": lock,
        }

    def command(self, run: HarnessRun) -> str:
        """`opencode run` with the task on stdin (as a word it would be quoted), ripgrep on its PATH."""
        modules = f"{run.root}/node_modules"
        ripgrep = f'export PATH="$(printf %s: {modules}/@vscode/ripgrep-*/bin)$PATH"'
        return f"{ripgrep} && printf %s {run.quoted_task} | {modules}/.bin/opencode run"

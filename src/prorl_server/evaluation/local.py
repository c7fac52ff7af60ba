"""`prorl-server eval --local`: a prorl-server (and a dev engine when no backend is given) on this machine,
child processes of the run (`prorl_server.launch.LocalStack`), stopped when it ends."""

from __future__ import annotations

import contextlib
import tempfile
from pathlib import Path

from prorl_server.evaluation.errors import EvalError
from prorl_server.launch import LocalStack


def start_local_server(exits: contextlib.ExitStack, llm_servers: list[str], serve_args: list[str]) -> str:
    """Start a server without an API key, on `llm_servers` (none: a dev engine, which needs the devllm extra),
    with `serve_args` added to its `prorl-server serve` command; returns its URL. Everything started stops
    when `exits` closes. EvalError, with the last line of the child's log, when a child does not start."""
    logs = Path(exits.enter_context(tempfile.TemporaryDirectory(prefix="prorl-eval-")))
    stack = exits.enter_context(LocalStack(logs, no_api_key=True))
    try:
        backends = llm_servers or [stack.dev_llm()]
        options = [option for url in backends for option in ("--llm-server", url)]
        return stack.server(*options, *serve_args)
    except RuntimeError as exc:
        lines = str(exc).strip().splitlines()
        last = f": {lines[-1].strip()}" if len(lines) > 1 else ""
        raise EvalError(f"the local stack did not start: {lines[0]}{last}") from None

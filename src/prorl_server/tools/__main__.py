"""`python -m prorl_server.tools --socket PATH [--workdir DIR]`: run the execution server.

Ready when the socket file exists (it is renamed into place once listening) and, for whoever reads the
server's stdout, when the line `{"ready": true, "pid": ..., "socket": ...}` is printed. Stops on the
`shutdown` action or on SIGTERM/SIGINT/SIGHUP, killing its shell and kernel with their children.
"""

from __future__ import annotations

import _signal
import os
import sys

from prorl_server.tools import wire
from prorl_server.tools.protocol import SOCKET_NAME
from prorl_server.tools.server import ToolServer

TYPE_CHECKING = False  # not `typing.TYPE_CHECKING`: importing typing costs start-up time
if TYPE_CHECKING:
    from typing import NoReturn

USAGE = f"""usage: python -m prorl_server.tools --socket PATH [--workdir DIR]

  --socket PATH   Unix socket to create (conventionally .../{SOCKET_NAME}); mode 0600
  --workdir DIR   working directory of the shell and the kernel, where relative paths of the editor and
                  file actions start (default: the current directory)
"""


def parse_args(argv: list[str]) -> dict[str, str]:
    """`--socket PATH` and `--workdir DIR` (also `--name=value`); exits with the usage on anything else.

    Hand-written because argparse alone costs several milliseconds of the start-up budget."""
    options = {"--socket": "", "--workdir": "."}
    rest = list(argv)
    while rest:
        name, _, value = rest.pop(0).partition("=")
        if name in ("-h", "--help"):
            print(USAGE, end="")
            sys.exit(0)
        if name not in options or (not value and not rest):
            sys.exit(f"{USAGE}error: unexpected argument {name!r} or missing value")
        options[name] = value or rest.pop(0)
    if not options["--socket"]:
        sys.exit(f"{USAGE}error: --socket is required")
    if not os.path.isdir(options["--workdir"]):
        sys.exit(f"{USAGE}error: --workdir {options['--workdir']} is not a directory")
    return {"socket": options["--socket"], "workdir": options["--workdir"]}


def main(argv: list[str] | None = None) -> NoReturn:
    """Serve until shut down, clean up, then end the process with status 0."""
    args = parse_args(sys.argv[1:] if argv is None else argv)
    server = ToolServer(args["socket"], args["workdir"])
    for signum in (_signal.SIGTERM, _signal.SIGINT, _signal.SIGHUP):
        _signal.signal(signum, lambda *_: server.stopping.set())
    server.listen()
    try:
        print(wire.dumps({"ready": True, "pid": os.getpid(), "socket": args["socket"]}), flush=True)
    except (OSError, ValueError):  # nobody reads stdout
        pass
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

"""The execution server: newline-delimited JSON requests over a Unix domain socket (see protocol.py).

One thread per connection; a connection's requests are answered in order, so a client that wants calls in
parallel opens more connections. The shell and the kernel serialize their own calls; the editor and the
file actions run concurrently. Imports only C modules and `os` at startup (see wire.py): each tool's
module is loaded on its first call, the shell's ptyprocess and the kernel's jupyter_client with it.
"""

from __future__ import annotations

import os

from prorl_server.errors import ExecutionServerError
from prorl_server.tool_server import wire
from prorl_server.tool_server.protocol import DEFAULT_MAX_OUTPUT, MAX_LINE

TYPE_CHECKING = False  # not `typing.TYPE_CHECKING`: the server imports nothing it does not need at startup
if TYPE_CHECKING:
    import _socket

    from prorl_server.tool_server.bash import BashSession
    from prorl_server.tool_server.editor import Editor
    from prorl_server.tool_server.files import Files
    from prorl_server.tool_server.ipython_kernel import IPythonSession
    from prorl_server.tool_server.relay import Relay


REQUIRED = object()  # marks an argument without default in ARGUMENTS
DEFAULT_TIMEOUT_S = 30.0
NUMBER = (int, float)
# Arguments each action takes: name -> (accepted types, default).
ARGUMENTS: dict[str, dict[str, tuple[tuple[type, ...], object]]] = {
    "ping": {},
    "shutdown": {},
    "bash": {
        "command": ((str,), REQUIRED),
        "timeout": (NUMBER, DEFAULT_TIMEOUT_S),
        "max_output": ((int,), DEFAULT_MAX_OUTPUT),
    },
    "ipython": {
        "code": ((str,), REQUIRED),
        "timeout": (NUMBER, DEFAULT_TIMEOUT_S),
        "max_output": ((int,), DEFAULT_MAX_OUTPUT),
    },
    "edit": {
        "command": ((str,), REQUIRED),
        "path": ((str,), REQUIRED),
        "file_text": ((str,), None),
        "old_str": ((str,), None),
        "new_str": ((str,), None),
        "insert_line": ((int,), None),
        "view_range": ((list,), None),
        "max_output": ((int,), DEFAULT_MAX_OUTPUT),
    },
    "read_file": {"path": ((str,), REQUIRED), "offset": ((int,), 0), "limit": ((int,), None)},
    "write_file": {"path": ((str,), REQUIRED), "content": ((str,), REQUIRED)},
    "upload": {"path": ((str,), REQUIRED), "data_b64": ((str,), REQUIRED), "mode": ((int,), None)},
    "download": {"path": ((str,), REQUIRED)},
    "gateway_relay": {"socket": ((str,), REQUIRED), "port": ((int,), REQUIRED)},
}
# Failures the caller caused or can act on: reported without a server traceback.
EXPECTED_ERRORS = ("BadRequest", "EditError", "FileTooLarge", "IPythonUnavailable")


class BadRequest(ExecutionServerError):
    """A request the server cannot act on (not JSON, unknown action, wrong arguments)."""


def arguments(action: object, request: dict[str, object]) -> dict[str, object]:
    """The request's arguments checked against ARGUMENTS, defaults filled in."""
    spec = ARGUMENTS.get(action) if isinstance(action, str) else None
    if spec is None:
        raise BadRequest(f"unknown action {action!r}; known actions: {', '.join(ARGUMENTS)}")
    given = {k: v for k, v in request.items() if k not in ("id", "action")}
    unknown = sorted(set(given) - set(spec))
    if unknown:
        raise BadRequest(f"unknown argument(s) {', '.join(unknown)} for {action}; it takes: {', '.join(spec)}")
    checked = {}
    for name, (types, default) in spec.items():
        value = given.get(name, default)
        if value is REQUIRED or (value is None and default is REQUIRED):
            raise BadRequest(f"{action} needs the argument {name!r}")
        if value is not None and (not isinstance(value, types) or isinstance(value, bool)):
            expected = " or ".join(t.__name__ for t in types)
            raise BadRequest(f"argument {name!r} of {action} must be {expected}, not {type(value).__name__}")
        checked[name] = value
    return checked


class ToolServer:
    """Serves one sandbox's shell, kernel, editor and files on a Unix domain socket."""

    def __init__(self, socket_path: str | None, workdir: str, listen_fd: int | None = None) -> None:
        self.socket_path = socket_path
        self.listen_fd = listen_fd
        self.workdir = os.path.abspath(workdir)
        self.stopping = wire.Flag()
        self.listener: _socket.socket | None = None
        self._socket_inode = 0
        self._setup_lock = wire.allocate_lock()
        self._state_dir: str | None = None
        self._bash: BashSession | None = None
        self._ipython: IPythonSession | None = None
        self._editor: Editor | None = None
        self._files: Files | None = None
        self._relay: Relay | None = None

    def listen(self) -> None:
        """Serve the inherited listening socket, or bind and listen on a private name, then rename it into
        place: the socket appears ready to use."""
        if self.listen_fd is not None:
            os.set_inheritable(self.listen_fd, False)  # the shell and the kernel must not hold it
            self.listener = wire.inherited_listener(self.listen_fd)
            return
        assert self.socket_path is not None, "ToolServer needs a socket path or a listening descriptor"
        # Short temporary name: AF_UNIX paths are limited to 107 bytes.
        temporary = os.path.join(os.path.dirname(self.socket_path), f".{os.getpid()}.sock")
        umask = os.umask(0o177)  # the socket file is created with mode 0600
        try:
            listener = wire.unix_listener(temporary)
        finally:
            os.umask(umask)
        self._socket_inode = os.stat(temporary).st_ino
        os.replace(temporary, self.socket_path)
        self.listener = listener

    def serve_until_stopped(self) -> None:
        """Accept connections on a background thread until `stopping` is set (shutdown action or signal)."""
        wire.start_thread(self._accept_loop)
        self.stopping.wait()

    def close(self) -> None:
        """Stop listening, kill the shell and the kernel with their children, remove private files."""
        if self.listener is not None:
            self.listener.close()
        if self._relay is not None:
            self._relay.close()
        if self.socket_path is not None and self._socket_inode:
            try:
                if os.stat(self.socket_path).st_ino == self._socket_inode:  # not a newer server's socket
                    os.unlink(self.socket_path)
            except FileNotFoundError:
                pass
        for session in (self._bash, self._ipython):
            if session is not None:
                try:
                    session.close()
                except Exception:  # a call still running may race the kill; go on
                    pass
        if self._state_dir is not None:
            import shutil

            shutil.rmtree(self._state_dir, ignore_errors=True)

    def handle(self, line: bytes) -> tuple[bytes, bool]:
        """Answer one request line; returns the response line and whether the server should stop."""
        try:
            request = wire.loads(line.decode())
        except ValueError as exc:  # UnicodeDecodeError included
            return wire.encode_line(
                {"id": None, "ok": False, "error": "BadRequest", "message": f"not JSON: {exc}"}
            ), False
        request_id = request.get("id") if isinstance(request, dict) else None
        try:
            if not isinstance(request, dict):
                raise BadRequest("a request is a JSON object")
            action = request.get("action")
            result = self.perform(action, arguments(action, request))
            response = {"id": request_id, "ok": True, **result}
            stop = action == "shutdown"
        except Exception as exc:
            response = {"id": request_id, "ok": False, "error": type(exc).__name__, "message": str(exc)}
            if not isinstance(exc, OSError) and response["error"] not in EXPECTED_ERRORS:
                import traceback

                response["traceback"] = traceback.format_exc()
            stop = False
        return wire.encode_line(response), stop

    def perform(self, action: str, args: dict[str, object]) -> dict[str, object]:
        """Run one action with checked arguments."""
        if action == "ping":
            return {"pid": os.getpid()}
        if action == "shutdown":
            return {}
        if action == "bash":
            return self.bash.run(args["command"], float(args["timeout"]), args["max_output"])
        if action == "ipython":
            return self.ipython.run(args["code"], float(args["timeout"]), args["max_output"])
        if action == "edit":
            options = {k: v for k, v in args.items() if v is not None and k not in ("command", "path")}
            return self.editor.run(args["command"], args["path"], **options)
        if action == "read_file":
            return self.files.read_file(args["path"], args["offset"], args["limit"])
        if action == "write_file":
            return self.files.write_file(args["path"], args["content"])
        if action == "upload":
            return self.files.upload(args["path"], args["data_b64"], args["mode"])
        if action == "gateway_relay":
            return self.gateway_relay(args["socket"], args["port"])
        return self.files.download(args["path"])

    def gateway_relay(self, target: str, port: int) -> dict[str, object]:
        """Start relaying `127.0.0.1:port` to the Unix socket `target` (relay.py); once per server."""
        with self._setup_lock:
            if self._relay is not None:
                raise BadRequest(f"the gateway relay already listens on port {self._relay.port}")
            if not 0 <= port <= 65535:
                raise BadRequest(f"port {port} is not a TCP port")
            from prorl_server.tool_server.relay import Relay

            self._relay = Relay(target, port)
            return {"port": self._relay.port}

    @property
    def state_dir(self) -> str:
        """A private directory for the shell's script file and the kernel's sockets (made on first use)."""
        if self._state_dir is None:
            import tempfile

            self._state_dir = tempfile.mkdtemp(prefix="prorl-tools-")
        return self._state_dir

    @property
    def bash(self) -> BashSession:
        """The persistent shell (its module is imported on first use)."""
        with self._setup_lock:
            if self._bash is None:
                from prorl_server.tool_server.bash import BashSession

                self._bash = BashSession(self.workdir, self.state_dir)
            return self._bash

    @property
    def ipython(self) -> IPythonSession:
        """The persistent kernel (its module is imported on first use)."""
        with self._setup_lock:
            if self._ipython is None:
                from prorl_server.tool_server.ipython_kernel import IPythonSession

                self._ipython = IPythonSession(self.workdir, self.state_dir)
            return self._ipython

    @property
    def editor(self) -> Editor:
        """The file editor with its undo history."""
        with self._setup_lock:
            if self._editor is None:
                from prorl_server.tool_server.editor import Editor

                self._editor = Editor(self.workdir)
            return self._editor

    @property
    def files(self) -> Files:
        """The file transfer actions."""
        with self._setup_lock:
            if self._files is None:
                from prorl_server.tool_server.files import Files

                self._files = Files(self.workdir)
            return self._files

    def _accept_loop(self) -> None:
        while not self.stopping.is_set():
            try:
                connection = wire.accept(self.listener)
            except OSError:  # the listener was closed
                return
            wire.start_thread(self._serve, connection)

    def _serve(self, connection: _socket.socket) -> None:
        lines = wire.LineReader(connection, MAX_LINE)
        try:
            while True:
                try:
                    line = lines.readline()
                except OSError:
                    return
                if not line:
                    return
                if not line.endswith(b"\n"):
                    error = {"id": None, "ok": False, "error": "BadRequest", "message": "request line too long"}
                    try:
                        connection.sendall(wire.encode_line(error))
                    except OSError:
                        pass
                    return
                response, stop = self.handle(line)
                try:
                    connection.sendall(response)
                except OSError:  # the client went away; the action's effects stay
                    return
                if stop:
                    self.stopping.set()
                    return
        finally:
            connection.close()

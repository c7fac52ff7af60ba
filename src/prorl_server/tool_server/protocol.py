"""Wire protocol of the in-sandbox execution server. Standard library only: it runs inside any image.

One request per line, one response per line, JSON, over a Unix domain socket; a connection may carry many
requests in sequence, answered in order (for calls in parallel, open more connections). A request is
`{"id": int, "action": str, ...arguments}`; the response is `{"id": int, "ok": bool, ...}`. On `ok` it
carries the action's observation fields; otherwise `error` (an exception class name) and `message`, plus
`traceback` when the server itself failed unexpectedly. Error names: `BadRequest` (not JSON, unknown action
or argument, wrong type), `EditError`, `FileTooLarge`, `IPythonUnavailable`, and OSError subclasses of the
file actions (`FileNotFoundError`, `IsADirectoryError`, `PermissionError`, ...); any other name is an
unexpected exception of the server (with `traceback`). The host's client raises one exception class per
name (the table `ERROR_CLASSES` of errors.py), never a string to compare.

Every command-like observation (bash, ipython) has: `output` (str), `exit_code` (int | None),
`timed_out` (bool), `truncated` (bool), `duration_s` (float). `output` is capped at `max_output`
characters: the head and the tail are kept around a line `\n[... output truncated: N more characters ...]\n`;
output past the cap is read and discarded, so memory stays bounded whatever a command prints. ANSI escapes
are removed, CRLF becomes LF, and a line rewritten with CR (a progress bar) keeps its last state.

Actions and their arguments:
- `ping` -> `{"pid": int}`
- `bash`: `command`, `timeout` (s, default 30), `max_output` (chars, default 64_000) -> observation.
  One persistent interactive bash on a pty: cwd, variables and functions persist. The command runs with
  stdin from /dev/null (a command that reads stdin gets end-of-file), TERM=dumb and PAGER=cat. `exit_code`
  is `$?` after the command, None on timeout. On timeout the foreground job gets Ctrl-C, then SIGKILL; if
  the shell still does not answer it is killed, the output says so, and the next command gets a fresh shell
  (state lost). `exit` also ends the shell (exit_code is its status; the next command gets a fresh one).
  Calls run one at a time; waiting for an earlier call counts against `timeout`.
- `ipython`: `code`, `timeout`, `max_output` -> observation + `error_name` (str | None). A persistent
  IPython kernel; `exit_code` is 0, or 1 when the cell raised (`error_name` is the exception's class and
  `output` has the traceback), None on timeout or when the kernel died. On timeout the kernel is
  interrupted (KeyboardInterrupt, state kept); if it does not stop it is killed and the next call starts a
  fresh kernel (state lost; the output says so). Starting the kernel (first call) does not count against
  `timeout`; waiting for an earlier cell does.
- `edit`: `command` in view|create|str_replace|insert|undo_edit, `path`, and `file_text` | `old_str`,
  `new_str` | `insert_line`, `new_str` | `view_range`, optional `max_output` -> `{"output": str}` (a failed
  edit is `ok: false` with `error: "EditError"` and a message the agent can learn from)
- `read_file`: `path`, `offset`?, `limit`? (lines, 0-based) -> `{"content": str}`; `write_file`: `path`,
  `content` -> `{"bytes": int}`
- `upload`: `path`, `data_b64`, `mode`? (int, e.g. 0o755) -> `{"bytes": int}`; `download`: `path` ->
  `{"data_b64": str}`
- `gateway_relay`: `socket` (a Unix socket's path), `port` (0: any free one) -> `{"port": int}`: from now on
  connections to `127.0.0.1:port` are relayed byte for byte to `socket` (relay.py; the host's gateway bridge,
  bound into the sandbox). Once per server (a second call is a BadRequest).
- `shutdown` -> `{}` then the server exits (killing its shell and kernel with their children)

Paths of edit and file actions are absolute or relative to the server's `--workdir` (not the shell's
current directory); writes create parent directories.

Starting: `python -m prorl_server.tool_server --socket PATH [--workdir DIR]`. The socket (mode 0600) is bound
under a temporary name and renamed to PATH once listening, so it exists only when it answers; the server
also prints `{"ready": true, "pid": ..., "socket": ...}` on stdout. SIGTERM, SIGINT and SIGHUP stop it like
`shutdown`. Its private files (the shell's command file, the kernel's ipc sockets) live in a directory under
$TMPDIR (default /tmp), removed on exit.
"""

from __future__ import annotations

SOCKET_NAME = "tools.sock"
ENV_OWNER = "PRORL_SANDBOX_OWNER"  # carried by every process a sandbox starts; the reaper looks for it
ENV_SANDBOX_ID = "PRORL_SANDBOX_ID"
DEFAULT_MAX_OUTPUT = 64_000  # characters of a bash, ipython or edit output unless the request says
MAX_LINE = 64 * 1024 * 1024  # bytes in one JSON line (uploads are base64 in one line)

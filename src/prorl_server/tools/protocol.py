"""Wire protocol of the in-sandbox execution server. Standard library only: it runs inside any image.

One request per line, one response per line, JSON, over a Unix domain socket; a connection may carry many
requests in sequence. A request is `{"id": int, "action": str, ...arguments}`; the response is
`{"id": int, "ok": bool, ...}`. On `ok` it carries the action's observation fields; otherwise `error`
(an exception class name) and `message`.

Every command-like observation (bash, ipython) has: `output` (str), `exit_code` (int | None),
`timed_out` (bool), `truncated` (bool), `duration_s` (float).

Actions and their arguments:
- `ping` -> `{"pid": int}`
- `bash`: `command`, `timeout` (s, default 30), `max_output` (chars, default 64_000) -> observation
- `ipython`: `code`, `timeout`, `max_output` -> observation (+ `error_name` on an exception; `output` has
  the traceback)
- `edit`: `command` in view|create|str_replace|insert|undo_edit, `path`, and `file_text` | `old_str`,
  `new_str` | `insert_line`, `new_str` | `view_range` -> `{"output": str}` (a failed edit is `ok: false`
  with a message the agent can learn from)
- `read_file`: `path`, `offset`?, `limit`? -> `{"content": str}`; `write_file`: `path`, `content` ->
  `{"bytes": int}`
- `upload`: `path`, `data_b64`, `mode`? -> `{"bytes": int}`; `download`: `path` -> `{"data_b64": str}`
- `shutdown` -> `{}` then the server exits
"""

from __future__ import annotations

SOCKET_NAME = "tools.sock"
ENV_OWNER = "PRORL_SANDBOX_OWNER"  # carried by every process a sandbox starts; the reaper looks for it
ENV_SANDBOX_ID = "PRORL_SANDBOX_ID"
MAX_LINE = 64 * 1024 * 1024  # bytes in one JSON line (uploads are base64 in one line)

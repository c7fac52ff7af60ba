"""The file editor action (view, create, str_replace, insert, undo_edit), worded after str_replace_editor.

A failed edit raises EditError whose message tells the agent what to do; the server returns it as
`ok: false`. Paths are absolute or relative to the working directory. Files are edited verbatim (no tab
expansion, line endings kept). Every successful create/str_replace/insert is recorded per file so
undo_edit can restore the previous content (or remove a file that `create` made).
"""

from __future__ import annotations

import os
import threading

from prorl_server.errors import ExecutionServerError
from prorl_server.tool_server.output import cap_text

COMMANDS = ("view", "create", "str_replace", "insert", "undo_edit")
SNIPPET_LINES = 4  # lines shown above and below an edit
LISTING_DEPTH = 2


class EditError(ExecutionServerError):
    """An edit that was not performed; the message is meant for the agent."""


def file_lines(text: str) -> list[str]:
    """Lines as `cat -n` and `grep -n` count them (split on LF only; a final LF ends the last line)."""
    lines = text.split("\n")
    return lines[:-1] if lines[-1] == "" else lines


def numbered(lines: list[str], first_line: int = 1) -> str:
    """`cat -n` style: right-aligned line numbers, a tab, the line; ends with a newline unless empty."""
    return "".join(f"{number:6}\t{line}\n" for number, line in enumerate(lines, first_line))


def read_text(path: str) -> str:
    """A file's content as text (line endings untouched); EditError for binary files."""
    with open(path, "rb") as f:
        data = f.read()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise EditError(f"The file {path} is not UTF-8 text; the editor only works on text files.") from None


def write_text(path: str, text: str) -> None:
    """Write text as UTF-8 without newline translation."""
    with open(path, "w", encoding="utf-8", newline="") as f:
        f.write(text)


def listing(root: str, depth: int = LISTING_DEPTH) -> list[str]:
    """Paths under `root` up to `depth` levels deep, hidden entries excluded, directories ending in '/'."""
    lines: list[str] = []

    def walk(directory: str, level: int) -> None:
        try:
            entries = sorted(os.scandir(directory), key=lambda e: e.name)
        except OSError:
            return
        for entry in entries:
            if entry.name.startswith("."):
                continue
            is_dir = entry.is_dir(follow_symlinks=False)
            lines.append(entry.path + ("/" if is_dir else ""))
            if is_dir and level < depth:
                walk(entry.path, level + 1)

    walk(root, 1)
    return lines


class Editor:
    """The editor with its per-file undo history; calls are serialized."""

    def __init__(self, workdir: str) -> None:
        self.workdir = workdir
        self.history: dict[str, list[str | None]] = {}  # path -> earlier contents (None: did not exist)
        self.lock = threading.Lock()

    def run(self, command: str, path: str, max_output: int = 64_000, **args: object) -> dict[str, str]:
        """Perform one editor command; returns {"output": text} or raises EditError (its message capped too)."""
        try:
            return self._run(command, path, max_output, args)
        except EditError as exc:  # a refusal the agent reads is capped like any output (the host checks it)
            raise EditError(cap_text(str(exc), "", 0, max_output)[0]) from None

    def _run(self, command: str, path: str, max_output: int, args: dict[str, object]) -> dict[str, str]:
        if command not in COMMANDS:
            raise EditError(f"Unrecognized command {command}. The allowed commands are: {', '.join(COMMANDS)}.")
        full = os.path.normpath(os.path.join(self.workdir, os.path.expanduser(path)))
        with self.lock:
            self._check_path(command, full)
            if command == "view":
                output = self._view(full, args.get("view_range"))
            elif command == "create":
                output = self._create(full, self._required(args, "file_text", command))
            elif command == "str_replace":
                old_str = self._required(args, "old_str", command)
                output = self._str_replace(full, old_str, self._optional_str(args, "new_str"))
            elif command == "insert":
                insert_line = self._required(args, "insert_line", command, int)
                output = self._insert(full, insert_line, self._required(args, "new_str", command))
            else:
                output = self._undo(full)
        return {"output": cap_text(output, "", 0, max_output)[0]}

    @staticmethod
    def _required(args: dict[str, object], name: str, command: str, kind: type = str) -> object:
        value = args.get(name)
        if value is None:
            raise EditError(f"Parameter `{name}` is required for command: {command}.")
        if not isinstance(value, kind) or isinstance(value, bool):
            raise EditError(f"Parameter `{name}` must be of type {kind.__name__}, got {type(value).__name__}.")
        return value

    @staticmethod
    def _optional_str(args: dict[str, object], name: str) -> str:
        value = args.get(name)
        if value is None:
            return ""
        if not isinstance(value, str):
            raise EditError(f"Parameter `{name}` must be of type str, got {type(value).__name__}.")
        return value

    @staticmethod
    def _check_path(command: str, path: str) -> None:
        exists = os.path.exists(path)
        if command == "create":
            if exists:
                raise EditError(f"File already exists at: {path}. Cannot overwrite files using command `create`.")
            return
        if command == "undo_edit":
            return
        if not exists:
            raise EditError(f"The path {path} does not exist. Please provide a valid path.")
        if os.path.isdir(path) and command != "view":
            raise EditError(f"The path {path} is a directory and only the `view` command can be used on directories.")

    def _view(self, path: str, view_range: object) -> str:
        if os.path.isdir(path):
            if view_range is not None:
                raise EditError("The `view_range` parameter is not allowed when `path` points to a directory.")
            entries = "\n".join(listing(path))
            return (
                f"Here's the files and directories up to {LISTING_DEPTH} levels deep in {path}, "
                f"excluding hidden items:\n{path}/\n{entries}\n"
            )
        lines = file_lines(read_text(path))
        if view_range is None:
            return f"Here's the result of running `cat -n` on {path}:\n{numbered(lines)}"
        start, end = self._check_view_range(view_range, len(lines))
        end = len(lines) if end == -1 else end
        shown = numbered(lines[start - 1 : end], start)
        return f"Here's the result of running `cat -n` on {path} (lines {start}-{end}):\n{shown}"

    @staticmethod
    def _check_view_range(view_range: object, n_lines: int) -> tuple[int, int]:
        valid = (
            isinstance(view_range, (list, tuple))
            and len(view_range) == 2
            and all(isinstance(x, int) and not isinstance(x, bool) for x in view_range)
        )
        if not valid:
            raise EditError(f"Invalid `view_range` parameter: {view_range}. It should be a list of two integers.")
        start, end = view_range
        if not 1 <= start <= n_lines:
            raise EditError(
                f"Invalid `view_range` parameter: {view_range}. Its first element `{start}` should be within "
                f"the range of lines of the file: [1, {n_lines}]."
            )
        if end != -1 and not start <= end <= n_lines:
            raise EditError(
                f"Invalid `view_range` parameter: {view_range}. Its second element `{end}` should be -1 (the end "
                f"of the file) or within [{start}, {n_lines}] (at least the first element, at most the number "
                "of lines)."
            )
        return start, end

    def _create(self, path: str, file_text: str) -> str:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        write_text(path, file_text)
        self.history.setdefault(path, []).append(None)
        return f"File created successfully at: {path}"

    def _str_replace(self, path: str, old_str: str, new_str: str) -> str:
        text = read_text(path)
        if not old_str:
            raise EditError("No replacement was performed: `old_str` is empty. Give the exact text to replace.")
        if old_str == new_str:
            raise EditError("No replacement was performed: `old_str` and `new_str` are identical.")
        count = text.count(old_str)
        if count == 0:
            raise EditError(f"No replacement was performed, old_str `{old_str}` did not appear verbatim in {path}.")
        if count > 1:
            lines = []
            at = text.find(old_str)
            while at != -1:
                lines.append(str(text.count("\n", 0, at) + 1))
                at = text.find(old_str, at + 1)
            raise EditError(
                f"No replacement was performed, old_str `{old_str}` appears {count} times in {path} "
                f"(lines {', '.join(lines)}); make it unique by including more surrounding lines."
            )
        at = text.index(old_str)
        new_text = text[:at] + new_str + text[at + len(old_str) :]
        write_text(path, new_text)
        self.history.setdefault(path, []).append(text)
        first = text.count("\n", 0, at) + 1
        return self._edited(path, new_text, first, first + new_str.count("\n"))

    def _insert(self, path: str, insert_line: int, new_str: str) -> str:
        text = read_text(path)
        lines = [line + "\n" for line in text.split("\n")]
        lines[-1] = lines[-1][:-1]
        if not lines[-1]:
            lines.pop()
        if not 0 <= insert_line <= len(lines):
            raise EditError(
                f"Invalid `insert_line` parameter: {insert_line}. It should be within the range of lines of "
                f"the file: [0, {len(lines)}]."
            )
        if insert_line == len(lines) and lines and not lines[-1].endswith("\n"):
            lines[-1] += "\n"
        block = new_str if new_str.endswith("\n") else new_str + "\n"
        new_text = "".join(lines[:insert_line]) + block + "".join(lines[insert_line:])
        write_text(path, new_text)
        self.history.setdefault(path, []).append(text)
        return self._edited(path, new_text, insert_line + 1, insert_line + block.count("\n"))

    def _undo(self, path: str) -> str:
        earlier = self.history.get(path)
        if not earlier:
            raise EditError(f"No edit history found for {path}.")
        previous = earlier.pop()
        if previous is None:
            os.remove(path)
            return f"Last edit to {path} undone successfully: the file created by `create` was removed."
        write_text(path, previous)
        return (
            f"Last edit to {path} undone successfully. Here's the result of running `cat -n` on {path}:\n"
            + numbered(file_lines(previous))
        )

    @staticmethod
    def _edited(path: str, text: str, first: int, last: int) -> str:
        """The success message with a numbered snippet from SNIPPET_LINES above `first` to below `last`."""
        lines = file_lines(text)
        start = max(1, first - SNIPPET_LINES)
        end = min(len(lines), last + SNIPPET_LINES)
        snippet = numbered(lines[start - 1 : end], start)
        return (
            f"The file {path} has been edited. Here's the result of running `cat -n` on a snippet of {path}:\n"
            f"{snippet}Review the changes and make sure they are as expected. Edit the file again if necessary."
        )

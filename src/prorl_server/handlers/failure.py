"""Where a handler's exception came from: the frame of handler code to name, and a short traceback.

"Handler code" is any frame outside the prorl_server package and the standard library (frozen importlib
frames included), so a KeyError raised in `dict.__getitem__` or a JSONDecodeError raised deep in `json`
is located at the handler's line that called them.
"""

from __future__ import annotations

import asyncio
import os
import sysconfig
import traceback
from functools import lru_cache
from types import FrameType, TracebackType

TRACEBACK_FRAMES = 5
"""Innermost frames kept in a result's `error.traceback`."""
TRACEBACK_MAX_CHARS = 2000
"""Characters of a result's `error.traceback` at most (its end is kept)."""
MESSAGE_MAX_CHARS = 2000
"""Characters of an exception's message in a result's `error.message` at most."""
_EXCEPTION_LINE_MAX_CHARS = 500

_SERVER_DIR = os.path.dirname(os.path.dirname(os.path.realpath(__file__)))
_STDLIB_DIRS = tuple(sorted({os.path.realpath(sysconfig.get_paths()[key]) for key in ("stdlib", "platstdlib")}))
_PACKAGE_DIRS = ("site-packages", "dist-packages")


@lru_cache(maxsize=4096)
def _is_server_or_stdlib(filename: str) -> bool:
    if filename.startswith("<"):  # <frozen importlib._bootstrap>, <string>
        return True
    path = os.path.realpath(filename)
    if _within(path, _SERVER_DIR):
        return True
    return any(
        _within(path, root) and not any(part in _PACKAGE_DIRS for part in os.path.relpath(path, root).split(os.sep))
        for root in _STDLIB_DIRS
    )


def _within(path: str, root: str) -> bool:
    return path == root or path.startswith(root + os.sep)


def _frames(tb: TracebackType | None) -> list[tuple[FrameType, int]]:
    return [(frame, lineno) for frame, lineno in traceback.walk_tb(tb) if lineno is not None]


def _describe(frame: FrameType, lineno: int) -> str:
    return f"{frame.f_code.co_filename}:{lineno} in {frame.f_code.co_name}"


def handler_location(exc: BaseException) -> str | None:
    """`path/file.py:123 in func` of the innermost frame of handler code in `exc`'s traceback, or None."""
    for frame, lineno in reversed(_frames(exc.__traceback__)):
        if not _is_server_or_stdlib(frame.f_code.co_filename):
            return _describe(frame, lineno)
    return None


def exception_location(exc: BaseException) -> str | None:
    """The handler frame of `exc` (see `handler_location`), else its innermost frame; None without a traceback."""
    location = handler_location(exc)
    if location is not None:
        return location
    frames = _frames(exc.__traceback__)
    return _describe(*frames[-1]) if frames else None


def import_error_location(exc: BaseException) -> str | None:
    """Where a plugin failed to import: a SyntaxError's file and line, else the innermost plugin frame."""
    if isinstance(exc, SyntaxError) and exc.filename and exc.lineno:
        return f"{exc.filename}:{exc.lineno}"
    return handler_location(exc)


def exception_message(exc: BaseException) -> str:
    """`str(exc)`, else `repr(exc)` when that is empty, at most MESSAGE_MAX_CHARS characters; never raises
    (an exception whose `__str__` or `__repr__` raises is described by its type)."""
    try:
        text = str(exc) or repr(exc)
    except BaseException as str_exc:  # a hostile __str__ may raise anything
        try:
            text = repr(exc)
        except BaseException:
            text = f"<{type(exc).__name__} object: its __str__ and __repr__ raised {type(str_exc).__name__}>"
    return text if len(text) <= MESSAGE_MAX_CHARS else text[: MESSAGE_MAX_CHARS - 3] + "..."


def short_traceback(exc: BaseException) -> str | None:
    """The last TRACEBACK_FRAMES frames of `exc` and its exception line, at most TRACEBACK_MAX_CHARS
    characters (the end is kept); None without a traceback."""
    frames = _frames(exc.__traceback__)
    if not frames:
        return None
    kept = frames[-TRACEBACK_FRAMES:]
    head = "Traceback (most recent call last):\n"
    if len(frames) > len(kept):
        head += f"  ... {len(frames) - len(kept)} earlier frames\n"
    body = "".join(traceback.StackSummary.extract(iter(kept)).format())
    line = "".join(traceback.format_exception_only(type(exc), exc)).rstrip("\n")
    if len(line) > _EXCEPTION_LINE_MAX_CHARS:
        line = line[: _EXCEPTION_LINE_MAX_CHARS - 3] + "..."
    text = f"{head}{body}{line}"
    if len(text) > TRACEBACK_MAX_CHARS:
        text = "..." + text[-(TRACEBACK_MAX_CHARS - 3) :]
    return text


def cancel_requested() -> bool:
    """Whether the running task has a cancellation pending (someone called its `cancel()`): a CancelledError
    it sees then is that request, while one raised with no request pending is a handler's own doing."""
    try:
        task = asyncio.current_task()
    except RuntimeError:  # no running loop: a worker thread
        return False
    return task is not None and task.cancelling() > 0

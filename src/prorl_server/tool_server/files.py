"""File transfer actions: read_file/write_file (text), upload/download (bytes as base64).

Paths are absolute or relative to the working directory; writes create parent directories.
"""

from __future__ import annotations

import base64
import binascii
import os

from prorl_server.errors import ExecutionServerError
from prorl_server.tool_server.protocol import MAX_LINE

# A download's base64 must fit in one response line with room for the JSON around it.
MAX_DOWNLOAD_BYTES = (MAX_LINE - 4096) // 4 * 3


class FileTooLarge(ExecutionServerError):
    """A file is too large to send in one response."""


class Files:
    """File actions rooted at a working directory."""

    def __init__(self, workdir: str) -> None:
        self.workdir = workdir

    def resolve(self, path: str) -> str:
        """An absolute path: `path` itself, or joined to the working directory."""
        return os.path.normpath(os.path.join(self.workdir, os.path.expanduser(path)))

    def read_file(self, path: str, offset: int = 0, limit: int | None = None) -> dict[str, object]:
        """Text of a file (UTF-8, undecodable bytes replaced); `offset`/`limit` select lines (0-based)."""
        with open(self.resolve(path), encoding="utf-8", errors="replace", newline="") as f:
            if not offset and limit is None:
                return {"content": f.read()}
            lines = f.readlines()
        end = None if limit is None else offset + limit
        return {"content": "".join(lines[offset:end])}

    def write_file(self, path: str, content: str) -> dict[str, object]:
        """Write text as UTF-8 (no newline translation); returns the number of bytes written."""
        data = content.encode("utf-8")
        self._write(self.resolve(path), data, None)
        return {"bytes": len(data)}

    def upload(self, path: str, data_b64: str, mode: int | None = None) -> dict[str, object]:
        """Write bytes given as base64, optionally chmod to `mode`; returns the number of bytes written."""
        try:
            data = base64.b64decode(data_b64, validate=True)
        except binascii.Error as exc:
            raise ValueError(f"data_b64 is not valid base64: {exc}") from None
        self._write(self.resolve(path), data, mode)
        return {"bytes": len(data)}

    def download(self, path: str) -> dict[str, object]:
        """A file's bytes as base64."""
        full = self.resolve(path)
        size = os.path.getsize(full)
        if size > MAX_DOWNLOAD_BYTES:
            raise FileTooLarge(
                f"{full} has {size} bytes, more than the {MAX_DOWNLOAD_BYTES} one download can carry; "
                "split it first (e.g. with `split -b`) and download the parts."
            )
        with open(full, "rb") as f:
            return {"data_b64": base64.b64encode(f.read()).decode("ascii")}

    @staticmethod
    def _write(path: str, data: bytes, mode: int | None) -> None:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(data)
        if mode is not None:
            os.chmod(path, mode)

"""Why a journal cannot be used; `serve` exits with the message."""

from __future__ import annotations


class JournalError(RuntimeError):
    """The journal cannot be opened: in use by another server, not a journal, corrupt, or not writable."""

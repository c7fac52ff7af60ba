"""The results journal: jobs and finished results in SQLite, so a crashed server comes back with them."""

from prorl_server.journal.database import JournalError
from prorl_server.journal.journal import RESTART_ERROR_TYPE, Journal

__all__ = ["RESTART_ERROR_TYPE", "Journal", "JournalError"]

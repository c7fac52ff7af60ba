"""Writing CSV text."""

from __future__ import annotations

from collections.abc import Iterable

QUOTE = '"'


def format_row(fields: Iterable[object], delimiter: str = ",") -> str:
    """One CSV line; fields with the delimiter, a quote or a line break are quoted."""
    out = []
    for field in fields:
        text = "" if field is None else str(field)
        if delimiter in text or QUOTE in text or "\n" in text or "\r" in text:
            text = QUOTE + text.replace(QUOTE, QUOTE * 2) + QUOTE
        out.append(text)
    return delimiter.join(out)


def format_rows(rows: Iterable[Iterable[object]], delimiter: str = ",") -> str:
    """CSV lines joined with newlines."""
    return "\n".join(format_row(row, delimiter) for row in rows)

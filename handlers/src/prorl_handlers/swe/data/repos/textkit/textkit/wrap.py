"""Word wrapping and truncation."""

from __future__ import annotations


def wrap(text: str, width: int) -> list[str]:
    """Greedy word wrap: lines of at most `width` characters; a longer word gets a line of its own."""
    if width < 1:
        raise ValueError("width must be at least 1")
    lines: list[str] = []
    current = ""
    for word in text.split():
        if not current:
            current = word
        elif len(current) + 1 + len(word) < width:
            current += " " + word
        else:
            lines.append(current)
            current = word
    if current:
        lines.append(current)
    return lines


def truncate(text: str, limit: int, suffix: str = "...") -> str:
    """`text` unchanged if it has at most `limit` characters, else cut to `limit` characters ending with `suffix`."""
    if limit < 0:
        raise ValueError("limit must not be negative")
    if len(text) <= limit:
        return text
    return text[:limit] + suffix

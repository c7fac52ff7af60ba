"""Reading CSV text."""

from __future__ import annotations

QUOTE = '"'


def parse_line(line: str, delimiter: str = ",") -> list[str]:
    """The fields of one CSV line. Quoted fields may contain the delimiter and doubled quotes."""
    fields: list[str] = []
    field: list[str] = []
    quoted = False
    for char in line:
        if quoted:
            if char == QUOTE:
                quoted = False
            else:
                field.append(char)
        elif char == QUOTE:
            quoted = True
        elif char == delimiter:
            fields.append("".join(field))
            field = []
        else:
            field.append(char)
    if quoted:
        raise ValueError(f"unterminated quoted field in {line!r}")
    fields.append("".join(field))
    return fields


def parse(text: str, delimiter: str = ",") -> list[list[str]]:
    """The rows of a CSV text, one list of fields per line."""
    return [parse_line(line, delimiter) for line in text.split("\n")]


def read_dicts(text: str, delimiter: str = ",") -> list[dict[str, str | None]]:
    """The rows after the header line as dicts keyed by the header's fields.

    A row with fewer fields than the header gets None for the missing ones.
    """
    rows = parse(text, delimiter)
    header, body = rows[0], rows[1:]
    return [dict(zip(header, row)) for row in body]

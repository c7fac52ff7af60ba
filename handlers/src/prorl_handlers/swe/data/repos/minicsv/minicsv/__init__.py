"""A tiny CSV reader and writer for strings."""

from minicsv.reader import parse, parse_line, read_dicts
from minicsv.writer import format_row, format_rows

__all__ = ["format_row", "format_rows", "parse", "parse_line", "read_dicts"]

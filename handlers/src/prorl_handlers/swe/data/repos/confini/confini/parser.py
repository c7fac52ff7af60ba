"""Parsing INI text into sections of key/value strings."""

from __future__ import annotations


class ConfigError(ValueError):
    """The configuration text or a value in it is invalid."""


def parse(text: str) -> dict[str, dict[str, str]]:
    """Sections of `text` as {section: {key: value}}.

    Blank lines and lines starting with ; or # are skipped; `key = value` lines belong to the last
    `[section]` header.
    """
    sections: dict[str, dict[str, str]] = {}
    current: dict[str, str] | None = None
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith((";", "#")):
            continue
        if line.startswith("[") and line.endswith("]"):
            current = sections.setdefault(line[1:-1].strip(), {})
            continue
        if current is None:
            raise ConfigError(f"line {number}: a key outside of any [section]")
        if "=" not in line:
            raise ConfigError(f"line {number}: expected `key = value`, got {line!r}")
        key, value = line.split("=", 1)
        current[key.strip()] = value.strip()
    return sections

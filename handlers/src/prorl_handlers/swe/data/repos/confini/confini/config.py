"""Typed access to a parsed configuration."""

from __future__ import annotations

from confini.parser import ConfigError, parse

TRUE = frozenset({"1", "yes", "true", "on"})
FALSE = frozenset({"0", "no", "false", "off"})


class Config:
    """A parsed configuration: `get`, `getint`, `getbool` by section and key."""

    def __init__(self, sections: dict[str, dict[str, str]]) -> None:
        self._sections = sections

    @classmethod
    def from_string(cls, text: str) -> Config:
        """Parse INI text."""
        return cls(parse(text))

    def sections(self) -> list[str]:
        """The section names, in order of appearance."""
        return list(self._sections)

    def get(self, section: str, key: str, default: str | None = None) -> str | None:
        """The raw string value, or `default` when the section or key is missing."""
        return self._sections.get(section, {}).get(key, default)

    def getint(self, section: str, key: str, default: int | None = None) -> int | None:
        """The value as an int, or `default` when missing."""
        value = self.get(section, key)
        if value is None:
            return default
        try:
            return int(value)
        except ValueError:
            raise ConfigError(f"[{section}] {key} is not an integer: {value!r}") from None

    def getbool(self, section: str, key: str, default: bool | None = None) -> bool | None:
        """The value as a bool (1/yes/true/on, 0/no/false/off), or `default` when missing."""
        value = self.get(section, key)
        if value is None:
            return default
        return value.lower() in TRUE

"""The Version type."""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass

_VERSION = re.compile(
    r"^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)"
    r"(?:-([0-9A-Za-z-]+(?:\.[0-9A-Za-z-]+)*))?"
    r"(?:\+([0-9A-Za-z-]+(?:\.[0-9A-Za-z-]+)*))?$"
)


@functools.total_ordering
@dataclass(frozen=True, eq=False)
class Version:
    """major.minor.patch[-prerelease][+build]. Build metadata does not take part in comparisons."""

    major: int
    minor: int
    patch: int
    prerelease: tuple[str, ...] = ()
    build: tuple[str, ...] = ()

    @classmethod
    def parse(cls, text: str) -> Version:
        """Parse "1.2.3", "1.2.3-rc.1", "1.2.3+build.5"; raises ValueError otherwise."""
        match = _VERSION.match(text.strip())
        if match is None:
            raise ValueError(f"not a semantic version: {text!r}")
        major, minor, patch, pre, build = match.groups()
        return cls(
            int(major),
            int(minor),
            int(patch),
            tuple(pre.split(".")) if pre else (),
            tuple(build.split(".")) if build else (),
        )

    def __str__(self) -> str:
        text = f"{self.major}.{self.minor}.{self.patch}"
        if self.prerelease:
            text += "-" + ".".join(self.prerelease)
        if self.build:
            text += "+" + ".".join(self.build)
        return text

    def _key(self) -> tuple:
        return (self.major, self.minor, self.patch, self.prerelease)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Version):
            return NotImplemented
        return self._key() == other._key()

    def __lt__(self, other: Version) -> bool:
        return self._key() < other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def bump(self, part: str) -> Version:
        """The next version: "major" -> (x+1).0.0, "minor" -> x.(y+1).0, "patch" -> x.y.(z+1)."""
        if part == "major":
            return Version(self.major + 1, 0, 0)
        if part == "minor":
            return Version(self.major, self.minor + 1, self.patch)
        if part == "patch":
            return Version(self.major, self.minor, self.patch + 1)
        raise ValueError(f"part must be major, minor or patch, not {part!r}")

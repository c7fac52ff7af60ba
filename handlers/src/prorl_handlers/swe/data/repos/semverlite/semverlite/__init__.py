"""Semantic versions (semver.org 2.0.0): parsing, ordering, bumping and ranges."""

from semverlite.ranges import satisfies
from semverlite.version import Version

__all__ = ["Version", "satisfies"]

"""Version ranges: does a version satisfy a range such as "^1.2.0" or ">=1.0.0 <2.0.0"?"""

from __future__ import annotations

import operator

from semverlite.version import Version

_OPERATORS = {">=": operator.ge, "<=": operator.le, ">": operator.gt, "<": operator.lt, "=": operator.eq}


def _comparators(term: str) -> list[tuple[str, Version]]:
    """A range term as (operator, version) pairs that must all hold."""
    if term.startswith("^"):
        low = Version.parse(term[1:])
        return [(">=", low), ("<", Version(low.major + 1, 0, 0))]
    if term.startswith("~"):
        low = Version.parse(term[1:])
        return [(">=", low), ("<", Version(low.major, low.minor + 1, 0))]
    for symbol in (">=", "<=", ">", "<", "="):
        if term.startswith(symbol):
            return [(symbol, Version.parse(term[len(symbol) :]))]
    return [("=", Version.parse(term))]


def satisfies(version: str | Version, spec: str) -> bool:
    """True when `version` satisfies every space-separated term of `spec`."""
    if isinstance(version, str):
        version = Version.parse(version)
    return all(
        _OPERATORS[symbol](version, bound) for term in spec.split() for symbol, bound in _comparators(term)
    )

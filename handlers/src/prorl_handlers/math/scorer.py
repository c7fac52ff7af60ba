"""Runs INSIDE a sandbox: `python3 scorer.py INPUT.json` prints {"equal": bool, "error": str | None}.

INPUT holds {"answer": ..., "reference": ...}, both normalized by `grading.normalize`. sympy's parser runs
Python code, so only a small expression language reaches it: digits, single-letter variables, the names in
`NAMES`, `+ - * / ^ ( ) . ,` and spaces. Never import this module on the host to score model output.
"""

from __future__ import annotations

import json
import re
import sys

import sympy
from sympy.parsing.sympy_parser import (
    convert_xor,
    implicit_multiplication_application,
    parse_expr,
    standard_transformations,
)

NAMES = {"sqrt": sympy.sqrt, "pi": sympy.pi, "e": sympy.E, "E": sympy.E, "I": sympy.I, "oo": sympy.oo,
         "exp": sympy.exp, "log": sympy.log, "ln": sympy.log, "sin": sympy.sin, "cos": sympy.cos,
         "tan": sympy.tan, "abs": sympy.Abs, "Abs": sympy.Abs}  # fmt: skip
TRANSFORMATIONS = (*standard_transformations, implicit_multiplication_application, convert_xor)
_ALLOWED = re.compile(r"[0-9A-Za-z+\-*/^()., ]*")
_ATTRIBUTE = re.compile(r"\.(?!\d)|[A-Za-z)]\s*\.")  # only decimal points: no attribute access
_TOLERANCE = 1e-9


def parse(text: str) -> sympy.Expr:
    """A sympy expression from the restricted language; ValueError for anything else."""
    if not text or not _ALLOWED.fullmatch(text):
        raise ValueError(f"unsupported characters in {text!r}")
    if _ATTRIBUTE.search(text):
        raise ValueError(f"a '.' that is not a decimal point in {text!r}")
    names = set(re.findall(r"[A-Za-z]+", text)) - set(NAMES)
    unknown = sorted(name for name in names if len(name) > 1)
    if unknown:
        raise ValueError(f"unknown names {unknown} in {text!r}")
    local = {**NAMES, **{name: sympy.Symbol(name) for name in names}}  # S, N, Q... are variables, not sympy's
    return parse_expr(text, local_dict=local, transformations=TRANSFORMATIONS, evaluate=True)


def equal(answer: str, reference: str) -> bool:
    """True when the two expressions are equal (exactly, or numerically within a relative 1e-9)."""
    a, b = parse(answer), parse(reference)
    diff = sympy.simplify(a - b)
    if diff == 0:
        return True
    if diff.free_symbols:
        return False
    scale = 1.0 if b.free_symbols else max(1.0, abs(complex(sympy.N(b))))
    return abs(complex(sympy.N(diff))) <= _TOLERANCE * scale


def main(path: str) -> None:
    """Score the pair in `path`; any failure is a not-equal verdict with the reason."""
    with open(path, encoding="utf-8") as f:
        pair = json.load(f)
    try:
        verdict = {"equal": equal(str(pair["answer"]), str(pair["reference"])), "error": None}
    except Exception as exc:
        verdict = {"equal": False, "error": f"{type(exc).__name__}: {exc}"[:300]}
    print(json.dumps(verdict))


if __name__ == "__main__":
    main(sys.argv[1])

"""Is an answer equal to the reference? Exact numbers on the host; anything else by sympy, in a sandbox.

sympy's parser evaluates Python, so model output never reaches sympy on the host: when either side is not a
plain number after `normalize`, `scorer.py` compares them inside a sandbox, with a timeout.
"""

from __future__ import annotations

import json
import re
from collections.abc import Awaitable, Callable
from fractions import Fraction
from pathlib import Path
from typing import Any

from prorl_server.sandbox import Sandbox

MAX_ANSWER_CHARS = 200
SCORER_TIMEOUT_S = 10
SCORER_SOURCE = Path(__file__).with_name("scorer.py")
SCORER_PATH, INPUT_PATH = "/tmp/prorl_math_scorer.py", "/tmp/prorl_math_input.json"

_LATEX = [  # applied until nothing changes, so nested \frac{\sqrt{2}}{2} works
    (re.compile(r"\\sqrt\s*\{([^{}]*)\}"), r"sqrt(\1)"),
    (re.compile(r"\\[dt]?frac\s*\{([^{}]*)\}\s*\{([^{}]*)\}"), r"(\1)/(\2)"),
]
_DROP = re.compile(r"\\left|\\right|\\[,;!]|\\?%|\$|\\\(|\\\)|\\\[|\\\]|\\text\{[^{}]*\}")
_THOUSANDS = re.compile(r"(?<=\d),(?=\d{3}(?!\d))")
_NAMED = re.compile(r"^[A-Za-z]\w*\s*=\s*")  # "x = 3" -> "3"
_NUMBER = re.compile(r"[+-]?(?:\d+\.?\d*|\.\d+)")


def boxed(text: str) -> str:
    """The content of the last `\\boxed{...}` (braces balanced), else the text itself."""
    start = text.rfind("\\boxed")
    brace = text.find("{", start)
    if start < 0 or brace < 0:
        return text
    depth = 0
    for i in range(brace, len(text)):
        depth += {"{": 1, "}": -1}.get(text[i], 0)
        if depth == 0:
            return text[brace + 1 : i]
    return text[brace + 1 :]


def normalize(text: str) -> str:
    """Plain-text math from an answer: \\boxed, $, %, thousands commas and simple LaTeX removed."""
    text = _DROP.sub("", boxed(text)).strip().rstrip(".").strip()
    text = _THOUSANDS.sub("", _NAMED.sub("", text))
    for _ in range(len(text)):
        before = text
        for pattern, replacement in _LATEX:
            text = pattern.sub(replacement, text)
        if text == before:
            break
    text = re.sub(r"\\(cdot|times)", "*", text).replace("\\pi", "pi").replace("{", "(").replace("}", ")")
    return text.replace("**", "^").strip()


def as_number(text: str) -> Fraction | None:
    """The exact value of an integer, decimal or `a/b` (parentheses allowed), else None."""
    parts = re.sub(r"[()\s]", "", text).split("/")
    if len(parts) > 2 or not all(_NUMBER.fullmatch(p) for p in parts):
        return None
    value, *divisor = (Fraction(p) for p in parts)
    if divisor and divisor[0] == 0:
        return None
    return value / divisor[0] if divisor else value


def numeric_match(answer: str, reference: str) -> bool | None:
    """Exact comparison when both are plain numbers, else None (a symbolic comparison is needed)."""
    a, b = as_number(normalize(answer)), as_number(normalize(reference))
    return None if a is None or b is None else a == b


async def symbolic_match(sandbox: Sandbox, answer: str, reference: str) -> dict[str, Any]:
    """Compare with sympy inside `sandbox` (`scorer.py`): {"correct": bool, "error": str | None}."""
    await sandbox.write_file(SCORER_PATH, SCORER_SOURCE.read_text(encoding="utf-8"))
    await sandbox.write_file(INPUT_PATH, json.dumps({"answer": normalize(answer), "reference": normalize(reference)}))
    command = f"timeout -s KILL {SCORER_TIMEOUT_S} python3 {SCORER_PATH} {INPUT_PATH}"
    result = await sandbox.bash(command, timeout=SCORER_TIMEOUT_S + 5)
    if result.timed_out or result.exit_code == 137:  # killed by `timeout` (or the sandbox's OOM killer)
        return {"correct": False, "error": "the sympy scorer was stopped at its time or memory limit"}
    if result.exit_code != 0:
        raise RuntimeError(f"the sympy scorer failed; the sandbox's python3 needs sympy: {result.output[-500:]}")
    verdict = json.loads(result.output.strip().splitlines()[-1])
    return {"correct": verdict["equal"] is True, "error": verdict["error"]}


async def grade(answer: str | None, reference: str, start_sandbox: Callable[[], Awaitable[Sandbox]]) -> dict[str, Any]:
    """{"correct", "method", "error"}; a sandbox is started only when the comparison needs sympy."""
    if not answer or not answer.strip():
        return {"correct": False, "method": None, "error": "no answer submitted"}
    if len(answer) > MAX_ANSWER_CHARS:
        return {"correct": False, "method": None, "error": f"the answer is longer than {MAX_ANSWER_CHARS} characters"}
    same = numeric_match(answer, reference)
    if same is not None:
        return {"correct": same, "method": "numeric", "error": None}
    return {"method": "symbolic", **await symbolic_match(await start_sandbox(), answer, reference)}

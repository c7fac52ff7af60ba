"""Countdown: reach a target number with + - * / over given numbers, with feedback between attempts.

An instance looks like::

    {"data_source": "countdown", "numbers": [3, 5, 4, 2], "target": 24}

The model answers with ``<answer>(5 + 3 - 2) * 4</answer>``. The handler checks the expression (only
the given numbers, each at most once; only ``+ - * /`` and parentheses; exact rational arithmetic) and,
unless it hits the target, replies with feedback such as "evaluates to 26, which is too high" and lets
the model try again, up to ``max_turns`` answers. EVAL re-checks the final answer: reward 1.0 when it
equals the target, else 0.0. Everything is deterministic: no randomness, no clock, no network.

The module imports only the standard library and ``prorl_server``, so it also loads as a single file:
``prorl-server serve --handler countdown=path/to/countdown.py:CountdownHandler``.
"""

from __future__ import annotations

import ast
import re
from collections import Counter
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from prorl_server import AgentHandler, JobContext

DEFAULT_MAX_TURNS = 4
FEEDBACK_MODES = ("value", "direction")
MAX_EXPRESSION_CHARS = 200

_ANSWER_RE = re.compile(r"<answer>(.*?)</answer>", re.DOTALL | re.IGNORECASE)
_OPERATORS = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/"}


class ExpressionError(ValueError):
    """The answer is not a valid Countdown expression for this puzzle."""


@dataclass(frozen=True)
class Puzzle:
    """One Countdown instance: the numbers the model may use and the target to reach."""

    numbers: tuple[int, ...]
    target: int

    @classmethod
    def from_instance(cls, instance: dict[str, Any]) -> Puzzle:
        """Read and validate `numbers` and `target`; a ValueError names what is wrong."""
        numbers = instance.get("numbers")
        target = instance.get("target")
        if not isinstance(numbers, list) or not numbers or not all(_is_int(n) and n > 0 for n in numbers):
            raise ValueError(f"instance.numbers must be a non-empty list of positive integers, got {numbers!r}")
        if not _is_int(target):
            raise ValueError(f"instance.target must be an integer, got {target!r}")
        return cls(numbers=tuple(numbers), target=target)

    def prompt(self) -> str:
        """The task as the model first sees it."""
        numbers = ", ".join(str(n) for n in self.numbers)
        return (
            f"Using the numbers [{numbers}], write an arithmetic expression that equals {self.target}. "
            "You may use + - * / and parentheses, and each number at most once. "
            "Put the expression alone inside <answer></answer>, for example <answer>(1 + 2) * 3</answer>."
        )


@dataclass(frozen=True)
class Attempt:
    """What one model turn answered and how it scored."""

    expression: str | None
    value: Fraction | None = None
    error: str | None = None
    solved: bool = False

    def to_json(self) -> dict[str, Any]:
        """A JSON-safe record (artifacts and eval details travel to the trainer as JSON)."""
        value = None if self.value is None else str(self.value)
        return {"expression": self.expression, "value": value, "error": self.error, "solved": self.solved}


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def extract_answer(text: str) -> str | None:
    """The content of the last `<answer>...</answer>` in `text`, stripped, or None."""
    found = _ANSWER_RE.findall(text)
    return found[-1].strip() if found else None


def evaluate(expression: str, numbers: tuple[int, ...]) -> Fraction:
    """Exact value of `expression`, which may use each of `numbers` at most once (never Python's eval)."""
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise ExpressionError(f"the expression is longer than {MAX_EXPRESSION_CHARS} characters")
    try:
        tree = ast.parse(expression, mode="eval")
    except SyntaxError as exc:
        raise ExpressionError(f"'{expression}' is not a valid arithmetic expression") from exc
    used: Counter[int] = Counter()
    value = _value(tree.body, used)
    extra = used - Counter(numbers)
    if extra:
        listed = ", ".join(str(n) for n in sorted(extra.elements()))
        raise ExpressionError(f"it uses {listed} more often than available")
    return value


def _value(node: ast.expr, used: Counter[int]) -> Fraction:
    if isinstance(node, ast.Constant) and _is_int(node.value):
        used[node.value] += 1
        return Fraction(node.value)
    if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
        left, right = _value(node.left, used), _value(node.right, used)
        if isinstance(node.op, ast.Add):
            return left + right
        if isinstance(node.op, ast.Sub):
            return left - right
        if isinstance(node.op, ast.Mult):
            return left * right
        if right == 0:
            raise ExpressionError("it divides by zero")
        return left / right
    raise ExpressionError(f"'{ast.unparse(node)}' is not allowed: use integers, + - * / and parentheses only")


def check_answer(expression: str | None, puzzle: Puzzle) -> Attempt:
    """Score one answer (None when the reply had no `<answer>` tag)."""
    if expression is None:
        return Attempt(expression=None, error="no <answer>...</answer> found")
    try:
        value = evaluate(expression, puzzle.numbers)
    except ExpressionError as exc:
        return Attempt(expression=expression, error=str(exc))
    return Attempt(expression=expression, value=value, solved=value == puzzle.target)


def feedback(attempt: Attempt, puzzle: Puzzle, mode: str = "value") -> str:
    """The observation sent back after a wrong attempt. `mode="direction"` hides the value."""
    if attempt.error is not None:
        return f"Invalid answer: {attempt.error}. Try again."
    assert attempt.value is not None
    direction = "too high" if attempt.value > puzzle.target else "too low"
    if mode == "direction":
        return f"Your expression is {direction}. Try again."
    return f"{attempt.expression} = {attempt.value}, which is {direction} (target {puzzle.target}). Try again."


class CountdownHandler(AgentHandler):
    """Multi-turn Countdown: answer, get feedback, retry; reward 1.0 when the final answer is right.

    Agent settings (from `sampling_params` or `agent_config` of the request):
    `max_turns` (default 4), `max_context_length`, `system_prompt`, and this handler's own
    `feedback` ("value" or "direction"), declared in `agent_config_keys` so it never reaches vLLM.
    """

    name = "countdown"
    agent_config_keys = frozenset({"feedback"})

    async def init(self, ctx: JobContext) -> None:
        """Validate the instance once; a bad instance fails the job in INIT with a clear message."""
        ctx.state["puzzle"] = Puzzle.from_instance(ctx.instance)
        mode = ctx.agent_config.get("feedback", "value")
        if mode not in FEEDBACK_MODES:
            raise ValueError(f"agent_config.feedback must be one of {FEEDBACK_MODES}, got {mode!r}")

    async def run(self, ctx: JobContext) -> None:
        """The agent loop: generate, check, send feedback, until solved or out of turns."""
        puzzle: Puzzle = ctx.state["puzzle"]
        config = ctx.agent_config
        max_turns = int(config.get("max_turns", DEFAULT_MAX_TURNS))
        max_context = config.get("max_context_length")
        mode = config.get("feedback", "value")

        messages: list[dict[str, Any]] = []
        if config.get("system_prompt"):
            messages.append({"role": "system", "content": str(config["system_prompt"])})
        messages.append({"role": "user", "content": puzzle.prompt()})
        await ctx.llm.start(messages)

        attempts: list[dict[str, Any]] = []
        ctx.artifacts["attempts"] = attempts  # filled in place: a timed-out job still returns what it tried
        for turn in range(max_turns):
            overrides: dict[str, Any] = {}
            if max_context is not None:
                room = int(max_context) - len(ctx.llm.token_ids)
                if room <= 0:
                    ctx.artifacts["stopped"] = "max_context_length"
                    break
                overrides["max_tokens"] = min(room, int(ctx.sampling_params.get("max_tokens", room)))
            reply = await ctx.llm.generate(**overrides)
            attempt = check_answer(extract_answer(reply.text), puzzle)
            attempts.append(attempt.to_json())
            ctx.artifacts["answer"] = attempt.expression  # the latest answer is the one EVAL scores
            if attempt.solved or turn + 1 == max_turns:
                break
            await ctx.llm.add_messages([{"role": "user", "content": feedback(attempt, puzzle, mode)}])

    def eval(self, ctx: JobContext) -> dict[str, Any]:
        """Re-check the final answer from scratch (a plain `def`: it runs in a worker thread)."""
        puzzle: Puzzle = ctx.state["puzzle"]
        final = check_answer(ctx.artifacts.get("answer"), puzzle)
        return {
            "reward": 1.0 if final.solved else 0.0,
            "solved": final.solved,
            "turns": len(ctx.trajectory.turns),
            "final": final.to_json(),
        }

"""What every tool-call format shares: the parsed calls, the format's interface, and JSON helpers.

Parsing never raises: a call that cannot be read becomes a `MalformedCall` whose message the model reads
as its observation, so it can correct itself on the next turn.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

ToolSchemas = Sequence[Mapping[str, Any]]
"""Tool schemas as OpenAI sends them (`{"type": "function", "function": {...}}`) or bare functions."""


@dataclass(frozen=True)
class ToolCall:
    """One well-formed call."""

    name: str
    arguments: dict[str, Any]


@dataclass(frozen=True)
class MalformedCall:
    """A block that is meant as a call but is not one; `message` tells the model why."""

    text: str
    message: str


Parsed = tuple[str, list[ToolCall | MalformedCall]]
"""A turn's content (the text it says besides its calls, stripped) and its calls in order."""


class ToolCallFormat(ABC):
    """How one model family writes tool calls in its text."""

    name: str
    hint: str
    """One call as the model should write it, for error messages and reminders."""

    @abstractmethod
    def parse(self, text: str, tools: ToolSchemas | None = None) -> Parsed:
        """The content and calls of a model's turn; never raises. `tools` (the schemas the model was given)
        only matter to formats whose arguments are untyped text."""

    @abstractmethod
    def render(self, calls: Sequence[ToolCall]) -> str:
        """The text a model of this family emits for `calls` (what follows its content in the turn)."""

    @abstractmethod
    def detect(self, chat_template: str) -> bool:
        """Whether `chat_template` (Jinja text) is one of this family's."""

    def for_template(self, chat_template: str) -> ToolCallFormat:
        """This format as `chat_template`'s variant of the family writes it (most families have one)."""
        return self

    def malformed(self, text: str, why: str) -> MalformedCall:
        """A MalformedCall whose message ends with how to write the call."""
        return MalformedCall(text, f"{why}; write {self.hint}")

    def call_of(self, text: str, name: Any, arguments: Any) -> ToolCall | MalformedCall:
        """A call from a decoded name and arguments (an object, or a JSON string of one)."""
        if not isinstance(name, str) or not name:
            return self.malformed(text, 'the tool call needs a string "name"')
        if isinstance(arguments, str):  # some models send the arguments as a JSON string
            try:
                arguments = json.loads(arguments) if arguments.strip() else {}
            except ValueError:
                return self.malformed(text, f'"arguments" of {name} is a string that is not JSON')
        if not isinstance(arguments, dict):
            return self.malformed(text, f'"arguments" of {name} must be a JSON object')
        return ToolCall(name, arguments)


def dumps(value: Any) -> str:
    """JSON as chat templates write it (Hugging Face's `tojson`: no ASCII escaping, `, ` and `: `)."""
    return json.dumps(value, ensure_ascii=False)


def loads_object(text: str) -> tuple[Any, str | None]:
    """(value, None) for JSON text (a fence like ```json ... ``` around it is dropped), else (None, why)."""
    raw = text.strip()
    if raw.startswith("```"):  # models like to fence JSON
        raw = raw.strip("`").removeprefix("json").strip()
    try:
        return json.loads(raw), None
    except ValueError as exc:
        return None, str(exc)

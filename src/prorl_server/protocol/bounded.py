"""Bounded request types: job ids, and free-form JSON objects checked at the edge.

A free-form field (`instance`, `sampling_params`, `agent_config`, `tags`) is a JSON object the schema does
not describe. Unchecked, one request could store a value that no later answer can serialize (NaN or
Infinity, nesting deeper than pydantic-core serializes) or that costs every reader (huge `tags` are in every
`GET /llm_servers`). `JsonLimits.check` walks the value once, iteratively, and rejects it with a 422 that
says where it broke a bound.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Annotated, Any

from pydantic import BeforeValidator, Field
from pydantic_core import PydanticCustomError

JOB_ID_MAX_CHARS = 256

JobId = Annotated[str, Field(min_length=1, max_length=JOB_ID_MAX_CHARS)]
"""A job id: 1 to 256 characters."""

_SCALARS = (str, int, float, bool, type(None))


@dataclass(frozen=True)
class JsonLimits:
    """Bounds of one free-form JSON object; numbers must also be finite."""

    max_depth: int
    """Containers nested in one another, the field's own object included."""
    max_items: int
    """Values in the whole object (every member and array element, nested ones included)."""
    max_string_chars: int
    """Characters in one string value."""
    max_key_chars: int
    """Characters in one member name."""

    def check(self, value: Any) -> Any:
        """Return `value` unchanged, or raise PydanticCustomError naming the first bound it breaks and where.

        Runs before the field's own validation (which copies the object), so an oversized object costs
        nothing more; a value that is no object at all is left to that validation to reject.
        """
        if not isinstance(value, dict):
            return value
        stack: list[tuple[dict[str, Any] | list[Any], tuple[str | int, ...]]] = [(value, ())]
        items = 0
        while stack:
            container, path = stack.pop()
            if len(path) >= self.max_depth:
                raise self._error("json_too_deep", "Input should be nested at most {max_depth} levels deep", path)
            items += len(container)
            if items > self.max_items:
                raise self._error("json_too_large", "Input should have at most {max_items} values in all", path)
            entries = container.items() if isinstance(container, dict) else enumerate(container)
            for key, item in entries:
                if isinstance(key, str) and len(key) > self.max_key_chars:
                    raise self._error("string_too_long", "Keys should have at most {max_key_chars} characters", path)
                if isinstance(item, dict | list):
                    stack.append((item, (*path, key)))
                elif isinstance(item, str):
                    if len(item) > self.max_string_chars:
                        msg = "Strings should have at most {max_string_chars} characters"
                        raise self._error("string_too_long", msg, (*path, key))
                elif isinstance(item, float):
                    if not math.isfinite(item):
                        msg = "Input should be a finite number (JSON has no NaN or Infinity)"
                        raise self._error("finite_number", msg, (*path, key))
                elif not isinstance(item, _SCALARS):
                    msg = "Input should be JSON (object, array, string, number, boolean or null)"
                    raise self._error("json_type", msg, (*path, key))
        return value

    def _error(self, kind: str, message: str, path: tuple[str | int, ...]) -> PydanticCustomError:
        """A validation error whose message ends with where, inside the field, the value broke the bound."""
        at = ".".join(_short(str(part)) for part in path) if path else "the top level"
        return PydanticCustomError(kind, message + " (at {at})", {**vars(self), "at": at})


def _short(text: str, limit: int = 40) -> str:
    return text if len(text) <= limit else text[:limit] + "..."


TASK_JSON_LIMITS = JsonLimits(max_depth=64, max_items=1_000_000, max_string_chars=16 * 2**20, max_key_chars=4096)
"""`instance`, `sampling_params`, `agent_config`: room for an SWE instance's megabytes of text."""

TAGS_JSON_LIMITS = JsonLimits(max_depth=8, max_items=1_000, max_string_chars=4096, max_key_chars=256)
"""`tags` of a backend: small metadata, repeated in every `GET /llm_servers`."""

TaskJson = Annotated[dict[str, Any], BeforeValidator(TASK_JSON_LIMITS.check)]
"""A free-form JSON object of a job, within TASK_JSON_LIMITS."""

TagsJson = Annotated[dict[str, Any], BeforeValidator(TAGS_JSON_LIMITS.check)]
"""A backend's free-form tags, within TAGS_JSON_LIMITS."""

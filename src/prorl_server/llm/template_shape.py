"""TemplateShape: what a backend's chat template looks like around an assistant message.

LLMSession computes it once per backend (or per local tokenizer) and BackendPool keeps it in the backend's
notes; both import it from here, so neither imports the other for it.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TemplateShape:
    """What a backend's chat template looks like around an assistant message."""

    base_ids: list[int]
    turn_close: list[int]

    @classmethod
    def from_ids(cls, base: list[int], other: list[int]) -> TemplateShape:
        """The shape from the ids of the base and of the base with another assistant reply: the tokens the
        template puts after an assistant message are the suffix the two share."""
        return cls(base_ids=base, turn_close=base[len(base) - _common_suffix_len(base, other) :])


def _common_suffix_len(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[-1 - n] == b[-1 - n]:
        n += 1
    return n

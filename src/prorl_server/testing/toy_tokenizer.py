"""The scripted test double's toy tokenizer: ChatML specials are single ids, every other character is its
code point + 10; its chat template renders `tools` into the system turn as Hermes/Qwen templates do."""

from __future__ import annotations

import json
from typing import Any

TOOLS_PREAMBLE = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>"
)
TOOLS_EPILOGUE = (
    "\n</tools>\n\nFor each function call, return a json object with function name and arguments within "
    '<tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}'
    "\n</tool_call>"
)
"""What the system turn says about `tools`, around one JSON line per tool (Qwen 2.5's Hermes-style words)."""


class ToyChatTokenizer:
    """Character tokenizer with a ChatML template; specials are single tokens."""

    SPECIALS = {"<|endoftext|>": 0, "<|im_start|>": 1, "<|im_end|>": 2}
    OFFSET = 10
    VOCAB_SIZE = 0x110000 + OFFSET  # every code point has an id

    def __init__(self) -> None:
        self._by_id = {v: k for k, v in self.SPECIALS.items()}

    @property
    def eos_id(self) -> int:
        """The end-of-turn token (`<|im_end|>`)."""
        return self.SPECIALS["<|im_end|>"]

    def encode(self, text: str) -> list[int]:
        """Text -> ids, recognizing the special tokens."""
        ids: list[int] = []
        i = 0
        while i < len(text):
            for special, sid in self.SPECIALS.items():
                if text.startswith(special, i):
                    ids.append(sid)
                    i += len(special)
                    break
            else:
                ids.append(ord(text[i]) + self.OFFSET)
                i += 1
        return ids

    def decode(self, ids: list[int]) -> str:
        """Ids -> text (specials rendered as their strings)."""
        return "".join(self._by_id.get(i) or chr(i - self.OFFSET) for i in ids)

    def render(
        self, messages: list[dict[str, Any]], add_generation_prompt: bool, tools: list[dict[str, Any]] | None = None
    ) -> str:
        """ChatML rendering of a conversation; with `tools` (vLLM's tool dumps), a first system turn that
        holds the first system message's text, then the tools, as Qwen 2.5's template writes them."""
        text = ""
        if tools:
            head = ""
            if messages and messages[0]["role"] == "system":
                head = (messages[0].get("content") or "") + "\n\n"
                messages = messages[1:]
            listed = "".join("\n" + json.dumps(tool, ensure_ascii=False) for tool in tools)
            text = f"<|im_start|>system\n{head}{TOOLS_PREAMBLE}{listed}{TOOLS_EPILOGUE}<|im_end|>\n"
        text += "".join(f"<|im_start|>{m['role']}\n{m.get('content') or ''}<|im_end|>\n" for m in messages)
        return text + ("<|im_start|>assistant\n" if add_generation_prompt else "")

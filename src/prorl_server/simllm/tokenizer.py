"""The simulator's tokenizer: the scripted test double's character tokenizer with its ChatML template.

Every character is one token (its code point + 10); `<|endoftext|>`, `<|im_start|>` and `<|im_end|>` are
ids 0, 1 and 2, and `<|im_end|>` is the end of sequence. The vocabulary covers every code point, so token-id
prompts from any real tokenizer (ids below 1,114,122) are accepted; ids that are no character (3 to 9, the
surrogates) read as U+FFFD.
"""

from __future__ import annotations

from typing import Any

from prorl_server.devllm import DevLLMRequestError
from prorl_server.llm import vllm_tool, without_claude_code_header
from prorl_server.testing import ToyChatTokenizer

REPLACEMENT = "\ufffd"


class SimTokenizer:
    """Text <-> ids and the chat template, deterministic and model-free."""

    n_vocab = ToyChatTokenizer.VOCAB_SIZE

    def __init__(self) -> None:
        self._toy = ToyChatTokenizer()
        self.eos_id = self._toy.eos_id

    def encode(self, text: str) -> list[int]:
        """Text -> ids (special tokens written in the text become their ids)."""
        return self._toy.encode(text)

    def token_str(self, token: int) -> str:
        """The text of one id (specials kept)."""
        for special, sid in ToyChatTokenizer.SPECIALS.items():
            if token == sid:
                return special
        code = token - ToyChatTokenizer.OFFSET
        if code < 0 or 0xD800 <= code <= 0xDFFF:
            return REPLACEMENT
        return chr(code)

    def decode(self, ids: list[int]) -> str:
        """Ids -> text; ids outside the vocabulary are skipped, as vLLM's detokenize does."""
        return "".join(self.token_str(i) for i in ids if 0 <= i < self.n_vocab)

    def render_chat(
        self, messages: list[dict[str, Any]], *, add_generation_prompt: bool, tools: list[dict[str, Any]] | None = None
    ) -> str:
        """ChatML text of a conversation, `tools` in the first system turn as the test double renders them
        (template kwargs are not rendered; a system message's Claude Code header line left out, as vLLM
        does); a 400 for messages that are not `{"role": str, "content": str | null}`, or for a tool that is
        not a function with a name."""
        if not messages:
            raise DevLLMRequestError(
                "Cannot apply chat template to an empty conversation. Provide at least one message."
            )
        for message in messages:
            if not isinstance(message.get("role"), str) or not isinstance(message.get("content", ""), str | None):
                raise DevLLMRequestError(
                    "each message needs a string `role` and a string or null `content`", param="messages"
                )
        prepared = [{**m, "content": without_claude_code_header(m["role"], m.get("content") or "")} for m in messages]
        try:
            schemas = [vllm_tool(t) for t in tools] if tools else None
        except ValueError as exc:
            raise DevLLMRequestError(str(exc), param="tools") from None
        return self._toy.render(prepared, add_generation_prompt, schemas)

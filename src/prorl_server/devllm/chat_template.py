"""The model's own chat template (GGUF metadata `tokenizer.chat_template`), rendered with Jinja2.

Rendering goes through llama_cpp's `Jinja2ChatFormatter`, which sets up the environment the way
Hugging Face's `apply_chat_template` does (sandbox, `tojson`, `raise_exception`, `strftime_now`).
"""

from __future__ import annotations

from typing import Any

import jinja2

from prorl_server.devllm.errors import DevLLMRequestError

TEMPLATE_KEY = "tokenizer.chat_template"


class ChatTemplate:
    """Renders a conversation to prompt text, with or without the generation prompt."""

    def __init__(self, template: str, *, bos_token: str, eos_token: str) -> None:
        from llama_cpp.llama_chat_format import Jinja2ChatFormatter

        self.template = template
        self._formatters = {
            add: Jinja2ChatFormatter(template, eos_token=eos_token, bos_token=bos_token, add_generation_prompt=add)
            for add in (False, True)
        }

    def render(
        self,
        messages: list[dict[str, Any]],
        *,
        add_generation_prompt: bool,
        tools: list[dict[str, Any]] | None = None,
        template_kwargs: dict[str, Any] | None = None,
    ) -> str:
        """The prompt text of `messages`; template errors are the request's fault (400)."""
        for i, message in enumerate(messages):
            if not isinstance(message.get("role"), str):
                raise DevLLMRequestError(f"messages[{i}] has no 'role'", param="messages")
        kwargs = {k: v for k, v in (template_kwargs or {}).items() if k != "add_generation_prompt"}
        try:
            return self._formatters[add_generation_prompt](messages=messages, tools=tools, **kwargs).prompt
        except (jinja2.TemplateError, ValueError, TypeError) as exc:
            raise DevLLMRequestError(f"the chat template failed on these messages: {exc}", param="messages") from exc

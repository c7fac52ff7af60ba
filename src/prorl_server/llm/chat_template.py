"""Chat templates rendered as Hugging Face's `apply_chat_template` renders them, without transformers.

The environment is transformers': a sandboxed, immutable Jinja2 environment with `trim_blocks`,
`lstrip_blocks`, the `loopcontrols` extension and the `{% generation %}` block (rendered as its body: its
only other use is marking assistant tokens, which nothing here asks for); a `tojson` filter that is plain `json.dumps` (no HTML
escaping, with its `ensure_ascii`, `indent`, `separators` and `sort_keys` options); and the globals
`raise_exception(message)` (a TemplateError) and `strftime_now(format)` (the local time). A template is
rendered with `messages`, `tools`, `documents` (None), `add_generation_prompt` and the tokenizer's named
special tokens (`bos_token`, `eos_token`, ...), as transformers passes them.
"""

from __future__ import annotations

import json
from datetime import datetime
from functools import lru_cache
from typing import Any

import jinja2
import jinja2.ext
import jinja2.nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment


class _GenerationBlock(jinja2.ext.Extension):
    """`{% generation %}...{% endgeneration %}`: its body, as transformers renders it."""

    tags = {"generation"}

    def parse(self, parser: Any) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

    def _body(self, caller: Any) -> str:
        return caller()


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(
    value: Any, ensure_ascii: bool = False, indent: int | None = None, separators: Any = None, sort_keys: bool = False
) -> str:
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(format: str) -> str:
    return datetime.now().strftime(format)


@lru_cache(maxsize=32)
def compile_template(source: str) -> jinja2.Template:
    """The compiled template (cached); jinja2.TemplateSyntaxError when it does not parse."""
    environment = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[_GenerationBlock, jinja2.ext.loopcontrols]
    )
    environment.filters["tojson"] = _tojson
    environment.globals["raise_exception"] = _raise_exception
    environment.globals["strftime_now"] = _strftime_now
    return environment.from_string(source)


def render_chat(
    source: str,
    messages: list[dict[str, Any]],
    *,
    add_generation_prompt: bool,
    tools: list[dict[str, Any]] | None = None,
    special_tokens: dict[str, str] | None = None,
) -> str:
    """The text of `messages` under the template `source`; jinja2.TemplateError when the template refuses
    them (or any exception the template's own code raises)."""
    return compile_template(source).render(
        **(special_tokens or {}),
        messages=messages,
        tools=tools,
        documents=None,
        add_generation_prompt=add_generation_prompt,
    )

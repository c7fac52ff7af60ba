"""DeepSeek V3 / R1: calls between DeepSeek's tool-call tokens, the arguments in a fenced JSON block:

    <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME
    ```json
    {...}
    ```<｜tool▁call▁end｜><｜tool▁calls▁end｜>

(several calls one per line). DeepSeek V3.1's form, `<｜tool▁call▁begin｜>NAME<｜tool▁sep｜>{...}<｜tool▁call▁end｜>`, is
parsed too, and rendered for a V3.1 template.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from prorl_server.tool_call_formats.base import (
    MalformedCall,
    Parsed,
    ToolCall,
    ToolCallFormat,
    ToolSchemas,
    dumps,
    loads_object,
)

CALLS_BEGIN, CALLS_END = "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"
CALL_BEGIN, CALL_END, SEP = "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>", "<｜tool▁sep｜>"
_CALL = re.compile(
    re.escape(CALL_BEGIN) + r"(.*?)(?:" + "|".join(map(re.escape, (CALL_END, CALL_BEGIN, CALLS_END))) + r"|\Z)",
    re.DOTALL,
)


class DeepSeekV3Format(ToolCallFormat):
    """DeepSeek's tool-call tokens; `v31` renders V3.1's form (no type, no fence)."""

    name = "deepseek_v3"

    def __init__(self, v31: bool = False) -> None:
        self.v31 = v31
        self.hint = self.render([ToolCall("TOOL_NAME", {"ARGUMENT_NAME": "value"})])

    def parse(self, text: str, tools: ToolSchemas | None = None) -> Parsed:
        starts = [i for i in (text.find(CALLS_BEGIN), text.find(CALL_BEGIN)) if i >= 0]
        if not starts:
            return text.strip(), []
        start = min(starts)
        calls = [self._call(match.group(1)) for match in _CALL.finditer(text, start)]
        if not calls:  # the calls' begin token with no call after it
            calls = [self.malformed(text[start:], f"the tool calls have no {CALL_BEGIN}")]
        return text[:start].strip(), calls

    def render(self, calls: Sequence[ToolCall]) -> str:
        if self.v31:
            body = "".join(f"{CALL_BEGIN}{c.name}{SEP}{dumps(c.arguments)}{CALL_END}" for c in calls)
        else:
            body = "\n".join(
                f"{CALL_BEGIN}function{SEP}{c.name}\n```json\n{dumps(c.arguments)}\n```{CALL_END}" for c in calls
            )
        return f"{CALLS_BEGIN}{body}{CALLS_END}"

    def detect(self, chat_template: str) -> bool:
        return CALL_BEGIN in chat_template

    def for_template(self, chat_template: str) -> DeepSeekV3Format:
        return DeepSeekV3Format(v31="```json" not in chat_template)

    def _call(self, body: str) -> ToolCall | MalformedCall:
        head, found, rest = body.partition(SEP)
        if not found:
            return self.malformed(body, f"the tool call has no {SEP}")
        if head.strip() == "function" and "\n" in rest.strip():  # V3: type, then name and fenced JSON
            name, _, arguments = rest.strip().partition("\n")
        else:  # V3.1: name, then JSON
            name, arguments = head, rest
        value, error = loads_object(arguments)
        if error is not None:
            return self.malformed(body, f"the arguments of {name.strip()} are not valid JSON ({error})")
        return self.call_of(body, name.strip(), value)

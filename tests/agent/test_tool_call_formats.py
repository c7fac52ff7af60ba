"""Tool-call formats per model family: each family's real chat template (tests/fixtures/chat_templates, the
source named in each file's first comment) renders a conversation with tool calls the way Hugging Face's
`apply_chat_template` does; the assistant turn's text parses back to the same calls, and `render` writes
what the template wrote. Malformed calls come back as MalformedCall or text, never an exception."""

from __future__ import annotations

import json
import random
import string
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import jinja2
import jinja2.ext
import pytest
from jinja2.sandbox import ImmutableSandboxedEnvironment
from repo_paths import TEST_FIXTURES

from prorl_server.agent import parse_tool_calls
from prorl_server.tool_call_formats import FORMATS, MalformedCall, ToolCall, ToolCallFormat, detect_format

TEMPLATES = TEST_FIXTURES / "chat_templates"
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "bash",
            "description": "Run a shell command.",
            "parameters": {
                "type": "object",
                "properties": {
                    "command": {"type": "string", "description": "The command."},
                    "timeout": {"type": "integer", "description": "Seconds."},
                },
                "required": ["command"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "edit",
            "description": "Edit a file.",
            "parameters": {
                "type": "object",
                "properties": {
                    "path": {"type": "string", "description": "The file."},
                    "changes": {"type": "array", "description": "Line edits."},
                    "options": {"type": "object", "description": "Flags."},
                    "dry_run": {"type": "boolean", "description": "Only show."},
                },
            },
        },
    },
]
CALLS = [
    ToolCall("bash", {"command": "grep -n \"déjà vu\" src/*.py\necho 'done'", "timeout": 30}),
    ToolCall("edit", {"path": "a.py", "changes": [{"line": 3, "text": "x = 1"}], "options": {"backup": True}}),
]
CALL_IDS = ["call00001", "call00002"]  # Mistral's templates want 9 alphanumerics


def hf_render(template: str, messages: list[dict[str, Any]], **kwargs: Any) -> str:
    """`template` rendered as transformers' `apply_chat_template` renders it."""

    def raise_exception(message: str) -> None:
        raise jinja2.TemplateError(message)

    def tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None, separators=None, sort_keys=False):
        return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env.from_string(template).render(
        messages=messages, tools=TOOLS, bos_token="<s>", eos_token="</s>", add_generation_prompt=False, **kwargs
    )


@dataclass(frozen=True)
class Family:
    """A fixture, its format's name, and how the template frames an assistant turn around its calls."""

    fixture: str
    format: str
    header: str  # what the template writes before the turn's text
    end: str  # and after it
    calls: int = 2  # the template's most calls per turn
    exact: bool = True  # `render` writes what the template does (not: the template adds call ids, ...)
    content: str | None = ""  # the turn's content when it only makes calls, as the template wants it
    system: bool = True  # False: the template moves the system prompt to the last user message


FAMILIES = [
    Family("hermes", "hermes", "<|im_start|>assistant\n", "<|im_end|>\n"),
    Family("qwen3_coder", "qwen3_coder", "<|im_start|>assistant\n", "<|im_end|>\n"),
    Family("llama3_json", "llama3_json", "<|start_header_id|>assistant<|end_header_id|>\n\n", "<|eot_id|>", calls=1),
    Family("mistral", "mistral", "", "</s>"),
    Family("mistral_nemo", "mistral", "", "</s>", exact=False, system=False),  # it writes each call's id too
    Family("mistral_small_3_2", "mistral", "", "</s>", exact=False),  # name[CALL_ID]id[ARGS]{...}
    Family("deepseek_v3", "deepseek_v3", "<｜Assistant｜>", "<｜end▁of▁sentence｜>", content=None),
    Family("deepseek_v3_1", "deepseek_v3", "<｜Assistant｜><think></think>", "<｜end▁of▁sentence｜>"),
    # a past call as gpt-oss's template writes it: `to=` before the channel, no <|constrain|>
    Family("gpt_oss", "gpt_oss", "<|start|>assistant", "", calls=1, exact=False),
]


def template_of(family: Family) -> str:
    return (TEMPLATES / f"{family.fixture}.jinja").read_text()


def assistant_text(family: Family, calls: list[ToolCall]) -> str:
    """The text the template writes for an assistant turn making `calls` (the last message)."""
    template = template_of(family)
    before = [{"role": "system", "content": "You are careful."}] if family.system else []
    before.append({"role": "user", "content": "Fix the bug."})
    turn = {
        "role": "assistant",
        "content": family.content,
        "tool_calls": [
            {"id": i, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
            for i, c in zip(CALL_IDS, calls, strict=False)
        ],
    }
    prefix, whole = hf_render(template, before), hf_render(template, [*before, turn])
    assert whole.startswith(prefix)
    delta = whole[len(prefix) :]
    assert delta.startswith(family.header) and delta.endswith(family.end), delta
    return delta[len(family.header) : len(delta) - len(family.end)]


@pytest.mark.parametrize("family", FAMILIES, ids=lambda f: f.fixture)
def test_the_template_calls_parse_back_to_the_same_calls(family):
    tool_format = detect_format(template_of(family))
    assert tool_format is not None and tool_format.name == family.format
    calls = CALLS[: family.calls]
    text = assistant_text(family, calls)
    content, parsed = tool_format.parse(text, TOOLS)
    assert parsed == calls and content == ""
    if family.exact:
        assert tool_format.render(calls) == text
    assert tool_format.parse(tool_format.render(calls), TOOLS) == ("", calls)


@pytest.mark.parametrize("family", [f for f in FAMILIES if f.format != "llama3_json"], ids=lambda f: f.fixture)
def test_text_before_the_calls_is_the_content(family):
    tool_format = detect_format(template_of(family))
    assert tool_format is not None
    text = "I will look first.\n" + tool_format.render(CALLS[: family.calls])
    if family.format == "gpt_oss":  # harmony: a commentary message before the call
        text = (
            "<|channel|>commentary<|message|>I will look first.<|end|><|start|>assistant"
            + text[len("I will look first.\n") :]
        )
    assert tool_format.parse(text, TOOLS) == ("I will look first.", CALLS[: family.calls])


def test_llama3_calls_are_the_whole_turn():
    call = FORMATS["llama3_json"].render(CALLS[:1])
    assert FORMATS["llama3_json"].parse(f"<|python_tag|>{call}") == ("", CALLS[:1])
    assert FORMATS["llama3_json"].parse(f"I will look first.\n{call}") == (f"I will look first.\n{call}", [])
    assert FORMATS["llama3_json"].parse(FORMATS["llama3_json"].render(CALLS)) == ("", CALLS)  # `;` between


def test_detection_picks_each_family_variant():
    assert detect_format(template_of(FAMILIES[4])).render([CALLS[0]]).startswith('[TOOL_CALLS][{"name": "bash"')  # Nemo
    assert detect_format(template_of(FAMILIES[3])).render([CALLS[0]]).startswith("[TOOL_CALLS]bash[ARGS]{")
    v31 = detect_format(template_of(FAMILIES[7])).render([CALLS[0]])
    assert v31.startswith("<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>bash<｜tool▁sep｜>{")
    chatml_without_tools = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    assert detect_format(chatml_without_tools) is None


def test_gpt_oss_renders_what_openai_harmony_renders():
    # openai_harmony (oss-harmony 0.0.11 on PyPI) `render_conversation` of an analysis message and a
    # commentary message to functions.get_weather with content type "<|constrain|>json", decoded
    harmony = (
        "<|start|>assistant<|channel|>analysis<|message|>The user wants the weather.<|end|><|start|>assistant"
        "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>"
        '{"location": "San Francisco", "unit": "celsius"}<|call|>'
    )
    call = ToolCall("get_weather", {"location": "San Francisco", "unit": "celsius"})
    gpt_oss = FORMATS["gpt_oss"]
    turn = harmony.removeprefix("<|start|>assistant")  # the generation prompt ends with it
    assert gpt_oss.parse(turn) == ("", [call])  # the analysis channel is reasoning, not content
    assert harmony.endswith(gpt_oss.render([call]))
    # the engine ends the turn at <|call|> and may leave it out of the text
    assert gpt_oss.parse(turn.removesuffix("<|call|>")) == ("", [call])


def test_qwen3_coder_types_values_by_the_schema():
    qwen = FORMATS["qwen3_coder"]
    text = (
        "<tool_call>\n<function=bash>\n<parameter=command>\n42\n</parameter>\n<parameter=timeout>\n7\n"
        "</parameter>\n</function>\n</tool_call>"
    )
    assert qwen.parse(text, TOOLS)[1] == [ToolCall("bash", {"command": "42", "timeout": 7})]
    assert qwen.parse(text)[1] == [ToolCall("bash", {"command": 42, "timeout": 7})]  # no schema: JSON if it is
    flag = "<tool_call>\n<function=edit>\n<parameter=dry_run>\nTrue\n</parameter>\n</function>\n</tool_call>"
    assert qwen.parse(flag, TOOLS)[1] == [ToolCall("edit", {"dry_run": True})]


def test_hermes_keeps_the_agent_loops_parser():
    text = 'Let me check.<tool_call>{"name": "bash", "arguments": {"command": "ls"}}</tool_call>'
    assert parse_tool_calls(text) == FORMATS["hermes"].parse(text)[1] == [ToolCall("bash", {"command": "ls"})]


MALFORMED = {
    "hermes": ["<tool_call>{not json}</tool_call>", '<tool_call>{"arguments": {}}</tool_call>', "<tool_call>{"],
    "qwen3_coder": [
        "<tool_call>\n<parameter=x>\n1\n</parameter>\n</tool_call>",
        "<tool_call>\n<function=>\n</function>\n</tool_call>",
        "<tool_call>",
    ],
    "llama3_json": ['{"name": "bash", "parameters": {', '<|python_tag|>{"parameters": {}}', "<|python_tag|>print(1)"],
    "mistral": [
        "[TOOL_CALLS][{",
        "[TOOL_CALLS]bash[ARGS]{oops",
        "[TOOL_CALLS]bash",
        "[TOOL_CALLS][1]",
        "[TOOL_CALLS][]",
    ],
    "deepseek_v3": [
        "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>bash\n```json\n{\n```<｜tool▁call▁end｜>",
        "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>bash<｜tool▁call▁end｜>",
        "<｜tool▁calls▁begin｜>",
    ],
    "gpt_oss": [
        "<|channel|>commentary to=functions.bash <|constrain|>json<|message|>{oops<|call|>",
        "<|channel|>commentary to=functions.bash <|constrain|>json",
        "<|channel|>commentary to=functions. json<|message|>{}<|call|>",
    ],
}


@pytest.mark.parametrize(("name", "text"), [(n, t) for n, texts in MALFORMED.items() for t in texts])
def test_malformed_calls_are_reported_not_raised(name, text):
    content, calls = FORMATS[name].parse(text)
    assert isinstance(content, str) and calls and all(isinstance(c, MalformedCall) for c in calls)
    assert all(FORMATS[name].hint in c.message for c in calls)


@pytest.mark.parametrize("name", list(FORMATS))
def test_text_without_calls_is_content(name):
    text = 'The answer is 42. {"not": "a call"}' if name != "llama3_json" else '{"answer": 42}'
    assert FORMATS[name].parse(text) == (text, [])


def _markers(tool_format: ToolCallFormat) -> list[str]:
    sample = tool_format.render(CALLS[:1]) + tool_format.hint
    return [sample[i : i + n] for i in range(0, len(sample), 3) for n in (1, 4, 12)]


@pytest.mark.parametrize("name", list(FORMATS))
def test_random_text_never_raises(name):
    tool_format = FORMATS[name]
    pieces = [*_markers(tool_format), "{", "}", "[", "]", '"', "\n", "```", "<|start|>", "name", ":", ";"]
    rng = random.Random(f"{name}-random-text")
    for _ in range(400):
        text = "".join(rng.choice([*pieces, rng.choice(string.printable)]) for _ in range(rng.randint(0, 40)))
        content, calls = tool_format.parse(text, TOOLS)
        assert isinstance(content, str)
        assert all(isinstance(c, ToolCall | MalformedCall) for c in calls)
        assert all(isinstance(c.arguments, dict) for c in calls if isinstance(c, ToolCall))


def _random_value(rng: random.Random, depth: int = 0) -> Any:
    alphabet = string.ascii_letters + string.digits + " _-.,:'\"\\/\n\téü😀"
    kind = rng.randrange(6 if depth < 2 else 3)
    if kind == 0:
        return "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 20)))
    if kind == 1:
        return rng.randint(-1000, 1000)
    if kind == 2:
        return rng.choice([True, False])
    if kind == 3:
        return [_random_value(rng, depth + 1) for _ in range(rng.randint(0, 3))]
    return {f"k{i}": _random_value(rng, depth + 1) for i in range(rng.randint(0, 3))}


@pytest.mark.parametrize("name", list(FORMATS))
def test_render_then_parse_is_the_identity(name):
    tool_format = FORMATS[name]
    rng = random.Random(f"{name}-round-trip")
    json_types = {str: "string", int: "integer", bool: "boolean", list: "array", dict: "object"}
    for _ in range(200):
        calls = [
            ToolCall(f"tool_{rng.randrange(5)}", {f"arg{j}": _random_value(rng) for j in range(rng.randint(0, 3))})
            for _ in range(rng.randint(1, 3))
        ]
        schemas = [
            {
                "name": c.name,
                "parameters": {"properties": {k: {"type": json_types[type(v)]} for k, v in c.arguments.items()}},
            }
            for c in calls
        ]
        if len({c.name for c in calls}) < len(calls):  # one schema per tool name
            calls = calls[:1]
            schemas = schemas[:1]
        assert tool_format.parse(tool_format.render(calls), schemas) == ("", calls)


# choosing the format -------------------------------------------------------------------------------


def test_the_setting_names_every_format_and_auto_is_hermes():
    from typing import get_args

    from prorl_server.config import ServerSettings, ToolCallFormatName
    from prorl_server.tool_call_formats import HERMES, tool_format

    assert set(get_args(ToolCallFormatName)) == {"auto", *FORMATS}
    assert ServerSettings().tool_call_format == "auto" and tool_format("auto") is HERMES
    with pytest.raises(KeyError, match="known: gpt_oss"):
        tool_format("pythonic")


def test_the_gateway_parses_and_renders_in_the_servers_format():
    from prorl_server.gateway.messages import reply_of, template_message
    from prorl_server.gateway.protocol import AssistantMessage

    mistral = FORMATS["mistral"]
    reply = reply_of("Looking.[TOOL_CALLS]bash[ARGS]" + json.dumps(CALLS[0].arguments), True, mistral, TOOLS)
    assert reply.content == "Looking." and reply.tool_calls is not None
    [call] = reply.tool_calls
    assert call.function.name == "bash" and json.loads(call.function.arguments) == CALLS[0].arguments
    assert reply_of("[TOOL_CALLS]bash[ARGS]{oops", True, mistral, TOOLS).content == "[TOOL_CALLS]bash[ARGS]{oops"
    made_up = AssistantMessage.model_validate(
        {
            "role": "assistant",
            "content": "Looking.",
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "bash", "arguments": json.dumps(CALLS[0].arguments)},
                }
            ],
        }
    )
    assert template_message(made_up, None, mistral)["content"] == "Looking." + mistral.render(CALLS[:1])


def test_the_agent_loop_asks_for_its_format():
    from prorl_server.agent import AgentLoop, bash_tool, tools_prompt

    qwen = FORMATS["qwen3_coder"]
    assert qwen.hint in tools_prompt("Solve it.", [bash_tool()], qwen)
    assert "<tool_call></tool_call> XML tags" in tools_prompt("Solve it.", [bash_tool()])  # Hermes, as before
    with pytest.raises(KeyError):
        AgentLoop([bash_tool()], "Solve it.", tool_format="pythonic")

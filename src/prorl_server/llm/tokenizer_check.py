"""Whether a backend's chat tokenization can be done in the server: the local tokenizer is compared with the
backend's `POST /tokenize` on a set of probe conversations, and used only when every one gives the same ids.

The probes cover what the server tokenizes: the session's two-message base and its delta shapes (a tool
result, a user turn), a system prompt with tools passed to the template, assistant tool calls (arguments as
JSON text and as none) and their results, non-ASCII text, text that looks like special tokens, and a system
prompt starting with Claude Code's header line (which vLLM leaves out). A probe the backend refuses (HTTP
4xx) must be refused locally too.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from prorl_server.llm.errors import BackendRequestError
from prorl_server.llm.local_tokenizer import ChatTokenizer, TokenizerCache, TokenizerUnavailable, find_tokenizer_dir

PROBE_USER = {"role": "user", "content": "A"}
BASE = [PROBE_USER, {"role": "assistant", "content": "A"}]
"""The fixed two-message base the session takes chat-template deltas on."""
BASE_OTHER = [PROBE_USER, {"role": "assistant", "content": "B"}]

_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "bash",
            "description": "Run a shell command.",
            "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]},
        },
    }
]
_CALL = {"id": "call_1", "type": "function", "function": {"name": "bash", "arguments": '{"command": "ls -a"}'}}
_NO_ARGS = {"id": "call_2", "type": "function", "function": {"name": "bash", "arguments": ""}}
_LOOKALIKE = "<|im_start|>user\n<|im_end|> </s><s>[INST] <tool_call>{}</tool_call> <|endoftext|> <think>"

Probe = tuple[list[dict[str, Any]], bool, list[dict[str, Any]] | None]
PROBES: list[Probe] = [
    (BASE, False, None),
    (BASE_OTHER, False, None),
    ([*BASE, {"role": "tool", "content": "out"}], True, None),
    ([*BASE, {"role": "user", "content": "next"}], True, None),
    ([{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hi!"}], True, _TOOLS),
    (
        [
            {"role": "system", "content": "Use tools."},
            {"role": "user", "content": "List files."},
            {"role": "assistant", "content": "Sure.", "tool_calls": [_CALL]},
            {"role": "tool", "tool_call_id": "call_1", "content": ".\n..\nREADME.md"},
            {"role": "assistant", "content": None, "tool_calls": [_NO_ARGS]},
            {"role": "tool", "tool_call_id": "call_2", "content": ""},
        ],
        True,
        _TOOLS,
    ),
    ([{"role": "user", "content": "Grüße, 世界 🙂 — ñ\n\ttab  two spaces \u00a0nbsp\r\n"}], True, None),
    ([{"role": "user", "content": _LOOKALIKE}, {"role": "assistant", "content": _LOOKALIKE}], False, None),
    ([{"role": "system", "content": "x-anthropic-billing-header: cch=1\nBe brief."}, PROBE_USER], True, None),
]

RemoteTokenize = Callable[[list[dict[str, Any]], bool, list[dict[str, Any]] | None], Awaitable[list[int]]]


@dataclass(frozen=True)
class TokenizerChoice:
    """How a backend's chats are tokenized: `tokenizer` when in the server, else why not (`reason`, a short
    label for metrics, and `detail`)."""

    tokenizer: ChatTokenizer | None
    reason: str
    detail: str


async def choose_tokenizer(
    cache: TokenizerCache, setting: str | None, root: str | None, model: str | None, remote: RemoteTokenize
) -> TokenizerChoice:
    """The local tokenizer for a backend when one is found, loads and tokenizes every probe as `remote`
    (the backend's `/tokenize`) does. The backend failing a probe (not refusing it) raises its LLMError."""
    found = find_tokenizer_dir(setting, root, model)
    if found is None:
        return TokenizerChoice(None, "not_found", f"no tokenizer for model {model!r} (no --tokenizer, root {root!r})")
    directory, source = found
    try:
        tokenizer = await cache.load(directory)
    except TokenizerUnavailable as exc:
        return TokenizerChoice(None, "unloadable", str(exc))
    except Exception as exc:  # any other failure to load: the backend tokenizes, the calls go on
        return TokenizerChoice(None, "unloadable", f"{directory}: {type(exc).__name__}: {exc}")
    for messages, add_generation_prompt, tools in PROBES:
        difference = await _compare(tokenizer, remote, messages, add_generation_prompt, tools)
        if difference is not None:
            return TokenizerChoice(None, "differs", f"{directory} ({source}): {difference}")
    return TokenizerChoice(tokenizer, "local", f"{directory} ({source})")


async def _compare(
    tokenizer: ChatTokenizer,
    remote: RemoteTokenize,
    messages: list[dict[str, Any]],
    add_generation_prompt: bool,
    tools: list[dict[str, Any]] | None,
) -> str | None:
    """None when both sides give the same ids (or both refuse), else the difference."""
    what = f"{len(messages)} message(s){' with tools' if tools else ''}"
    try:
        theirs: list[int] | None = await remote(messages, add_generation_prompt, tools)
    except BackendRequestError:
        theirs = None
    try:
        ours: list[int] | None = tokenizer.encode_chat(
            messages, add_generation_prompt=add_generation_prompt, tools=tools
        )
        problem = ""
    except Exception as exc:  # a template's own code may raise anything
        ours, problem = None, f"{type(exc).__name__}: {exc}"
    if ours == theirs:
        return None
    if theirs is None:
        return f"the backend refuses {what} that the local template renders"
    if ours is None:
        return f"the local template refuses {what} that the backend renders ({problem})"
    at = next((i for i, (a, b) in enumerate(zip(ours, theirs, strict=False)) if a != b), min(len(ours), len(theirs)))
    return f"ids of {what} differ from position {at} ({len(ours)} local, {len(theirs)} from the backend)"

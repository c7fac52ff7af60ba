"""A backend model's tokenizer and chat template, loaded into the server (Hugging Face `tokenizers`, no torch).

`ChatTokenizer.encode_chat` gives the ids vLLM's `POST /tokenize` gives for `messages`: the messages are
prepared as vLLM 0.32 prepares them for a chat template whose content format is a string (a missing content
as "", Claude Code's header line left out of a system message, tool-call arguments as objects, tools as
vLLM's tool schema), rendered
with the model's template the way transformers does (`chat_template.py`) and encoded without adding special
tokens, as vLLM encodes a rendered chat. Messages outside that shape (`accepts`) are left to the backend.

Where the files come from (`find_tokenizer_dir`), first found wins: the `--tokenizer` directory, the `root`
the backend reports in `/v1/models` when it is a local directory with `tokenizer.json`, the Hugging Face
cache's snapshot of that `root` as a repository name, else of the served model name. `TokenizerCache` loads each directory once, in a thread of its
own, and shares it.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import copy
import json
import os
import threading
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer

from prorl_server.errors import ProrlError
from prorl_server.llm.chat_template import compile_template, render_chat

TOKENIZER_FILE = "tokenizer.json"
CONFIG_FILE = "tokenizer_config.json"
TEMPLATE_FILE = "chat_template.jinja"
SPECIAL_TOKENS_FILE = "special_tokens_map.json"
SPECIAL_TOKEN_NAMES = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")
"""The named special tokens transformers passes to a chat template."""

CLAUDE_CODE_HEADER = "x-anthropic-billing-header"
_ROLES = frozenset({"system", "user", "assistant", "tool"})
_MESSAGE_KEYS = frozenset({"role", "content", "tool_calls", "tool_call_id", "name"})


class TokenizerUnavailable(ProrlError):
    """A tokenizer directory that cannot be used: a file missing, unreadable or malformed."""


class ChatTokenizer:
    """One model's tokenizer and chat template(s) (`templates`: `default`, and `tool_use` when named so)."""

    def __init__(
        self, directory: Path, tokenizer: Tokenizer, templates: dict[str, str], special_tokens: dict[str, str]
    ) -> None:
        self.directory = directory
        self.tokenizer = tokenizer
        self.templates = templates
        self.special_tokens = special_tokens

    @property
    def chat_template(self) -> str:
        """The template a request without tools is rendered with."""
        return self.templates["default"]

    def template_for(self, tools: list[dict[str, Any]] | None) -> str:
        """The template transformers picks: `tool_use` when there are tools and it exists, else `default`."""
        if tools is not None and "tool_use" in self.templates:
            return self.templates["tool_use"]
        return self.templates["default"]

    @staticmethod
    def accepts(messages: list[dict[str, Any]]) -> bool:
        """Whether `encode_chat` prepares these messages as vLLM does (string contents; system, user, assistant
        and tool roles; role, content, tool_calls, tool_call_id and name fields)."""
        return bool(messages) and all(
            isinstance(m, dict)
            and m.get("role") in _ROLES
            and m.keys() <= _MESSAGE_KEYS
            and isinstance(m.get("content"), str | None)
            for m in messages
        )

    def encode_chat(
        self, messages: list[dict[str, Any]], *, add_generation_prompt: bool, tools: list[dict[str, Any]] | None = None
    ) -> list[int]:
        """The ids of the chat template of `messages`; ValueError (jinja2.TemplateError among them) when
        the template or vLLM's preparation refuses them."""
        schemas = [vllm_tool(t) for t in tools] if tools is not None else None
        text = render_chat(
            self.template_for(schemas),
            [vllm_message(m) for m in messages],
            add_generation_prompt=add_generation_prompt,
            tools=schemas,
            special_tokens=self.special_tokens,
        )
        return self.tokenizer.encode(text, add_special_tokens=False).ids


def vllm_message(message: dict[str, Any]) -> dict[str, Any]:
    """A message as vLLM hands it to a string-content chat template (a system message's first line dropped
    when it is Claude Code's attribution header, whose value changes at every request)."""
    role = message["role"]
    prepared: dict[str, Any] = {"role": role, "content": without_claude_code_header(role, message.get("content") or "")}
    if role == "assistant" and message.get("tool_calls") is not None:
        calls = [_vllm_call(c) for c in message["tool_calls"]]
        if calls:
            prepared["tool_calls"] = calls
    if role == "tool" and "tool_call_id" in message:
        prepared["tool_call_id"] = message["tool_call_id"]
    if isinstance(message.get("name"), str):
        prepared["name"] = message["name"]
    return prepared


def without_claude_code_header(role: str, content: str) -> str:
    """`content` of a `role` message as vLLM renders it: a system message's first line dropped when it is
    Claude Code's attribution header."""
    if role == "system" and content.startswith(CLAUDE_CODE_HEADER):
        return content.partition("\n")[2]
    return content


def _vllm_call(call: Any) -> dict[str, Any]:
    """A tool call with its arguments as an object (`{}` for none, malformed JSON, or not an object)."""
    if (
        not isinstance(call, dict)
        or call.get("type", "function") != "function"
        or not isinstance(call.get("function"), dict)
    ):
        raise ValueError("assistant tool_calls entries must be function calls")
    call = copy.deepcopy(call)
    function = call["function"]
    arguments = function.get("arguments")
    if isinstance(arguments, str) and arguments:
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError:
            arguments = None
    function["arguments"] = arguments if isinstance(arguments, dict) else {}
    return call


def vllm_tool(tool: dict[str, Any]) -> dict[str, Any]:
    """A tool as vLLM's tool schema dumps it: `type` and `function` (`name`, `description`, `parameters`,
    and `strict` when set); other fields dropped."""
    function = tool.get("function")
    if not isinstance(function, dict) or not isinstance(function.get("name"), str):
        raise ValueError("each tool needs a function with a name")
    schema: dict[str, Any] = {
        "name": function["name"],
        "description": function.get("description"),
        "parameters": function.get("parameters"),
    }
    if function.get("strict") is not None:
        schema["strict"] = function["strict"]
    return {"type": tool.get("type", "function"), "function": schema}


def load_chat_tokenizer(directory: Path) -> ChatTokenizer:
    """The tokenizer and chat template(s) of a model directory; TokenizerUnavailable saying what is wrong."""
    try:
        tokenizer = Tokenizer.from_file(str(directory / TOKENIZER_FILE))
    except Exception as exc:  # tokenizers raises a bare Exception for a malformed file
        raise TokenizerUnavailable(f"{directory / TOKENIZER_FILE} cannot be loaded: {exc}") from None
    config = _json_file(directory / CONFIG_FILE)
    legacy = _json_file(directory / SPECIAL_TOKENS_FILE)
    special_tokens: dict[str, str] = {}
    for name in SPECIAL_TOKEN_NAMES:
        value = config.get(name) or legacy.get(name)
        if isinstance(value, dict):  # a serialized AddedToken
            value = value.get("content")
        if isinstance(value, str):
            special_tokens[name] = value
    templates = _templates(directory, config)
    try:
        for source in templates.values():
            compile_template(source)
    except Exception as exc:
        raise TokenizerUnavailable(f"the chat template of {directory} does not compile: {exc}") from None
    return ChatTokenizer(directory, tokenizer, templates, special_tokens)


def _templates(directory: Path, config: dict[str, Any]) -> dict[str, str]:
    """The named chat templates, as transformers reads them: `chat_template.jinja` over the config's."""
    path = directory / TEMPLATE_FILE
    if path.is_file():
        try:
            return {"default": path.read_text(encoding="utf-8")}
        except (OSError, UnicodeDecodeError) as exc:
            raise TokenizerUnavailable(f"{path} cannot be read: {exc}") from None
    source = config.get("chat_template")
    if isinstance(source, str):
        return {"default": source}
    if isinstance(source, list):
        named = {
            t["name"]: t["template"]
            for t in source
            if isinstance(t, dict) and isinstance(t.get("name"), str) and isinstance(t.get("template"), str)
        }
        if "default" in named:
            return named
    raise TokenizerUnavailable(f"{directory} has no chat template ({TEMPLATE_FILE}, or chat_template in {CONFIG_FILE})")


def _json_file(path: Path) -> dict[str, Any]:
    """A JSON object file ({} when absent); TokenizerUnavailable when unreadable or malformed."""
    if not path.exists():
        return {}
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise TokenizerUnavailable(f"{path} cannot be read: {exc}") from None
    if not isinstance(value, dict):
        raise TokenizerUnavailable(f"{path} is not a JSON object")
    return value


def find_tokenizer_dir(explicit: str | None, root: str | None, model: str | None) -> tuple[Path, str] | None:
    """Where the backend's tokenizer is and how it was found (`setting`, `root`, `hf_cache`), or None: the
    setting; `root` when it is a directory with tokenizer.json; the Hugging Face cache's snapshot of `root`
    as a repository name (vLLM's root of a model it downloaded), else of the served name `model`."""
    if explicit:
        return Path(explicit).expanduser(), "setting"
    if root and (Path(root) / TOKENIZER_FILE).is_file():
        return Path(root), "root"
    for name in (root, model):
        snapshot = hf_cache_snapshot(name) if name else None
        if snapshot is not None:
            return snapshot, "hf_cache"
    return None


def hf_cache_snapshot(model: str) -> Path | None:
    """The Hugging Face cache's snapshot of repository `model` (`org/name`) at `refs/main`, when it holds a
    tokenizer.json."""
    if model.count("/") != 1 or ".." in model:
        return None
    hub = os.environ.get("HF_HUB_CACHE") or os.path.join(
        os.environ.get("HF_HOME") or os.path.join(os.path.expanduser("~"), ".cache", "huggingface"), "hub"
    )
    repo = Path(hub) / ("models--" + model.replace("/", "--"))
    try:
        revision = (repo / "refs" / "main").read_text().strip()
    except OSError:
        return None
    snapshot = repo / "snapshots" / revision
    return snapshot if (snapshot / TOKENIZER_FILE).is_file() else None


class TokenizerCache:
    """Chat tokenizers by directory, each loaded once (in a thread: never on an event loop) and shared by
    every backend serving from it; a failed load is remembered too."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._loads: dict[Path, concurrent.futures.Future[ChatTokenizer]] = {}

    async def load(self, directory: Path) -> ChatTokenizer:
        """The tokenizer of `directory`; TokenizerUnavailable when it cannot be used."""
        key = directory.resolve()
        with self._lock:
            future = self._loads.get(key)
            if future is None:
                future = self._loads[key] = concurrent.futures.Future()
                threading.Thread(target=_load_into, args=(key, future), name="tokenizer-load", daemon=True).start()
        return await asyncio.wrap_future(future)


def _load_into(directory: Path, future: concurrent.futures.Future[ChatTokenizer]) -> None:
    try:
        future.set_result(load_chat_tokenizer(directory))
    except BaseException as exc:
        future.set_exception(exc)

"""The test double's and the simulator's tokenizer (`ToyChatTokenizer`) as Hugging Face files, so that a
prorl-server can tokenize their chats in the server.

`write_tokenizer_files(directory)` writes `tokenizer.json` (a `tokenizers` BPE model without merges whose
vocabulary is every character, at its code point + 10, with `<|endoftext|>`, `<|im_start|>` and
`<|im_end|>` as special tokens 0, 1 and 2: the ids `ToyChatTokenizer.encode` gives), `chat_template.jinja`
(its ChatML rendering, `tools` in the first system turn) and `tokenizer_config.json`. The vocabulary has 1,112,064 entries: the file is
about 24 MB, written in about 1.5 s, and a server holding it uses about 320 MB for it.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

from tokenizers import AddedToken, Tokenizer, models

from prorl_server.testing.toy_tokenizer import TOOLS_EPILOGUE, TOOLS_PREAMBLE, ToyChatTokenizer

CHAT_TEMPLATE = (
    "{% set first = 1 if tools and messages and messages[0]['role'] == 'system' else 0 %}"
    "{% if tools %}"
    "{{ '<|im_start|>system\\n' }}"
    "{% if first %}{{ (messages[0]['content'] or '') + '\\n\\n' }}{% endif %}"
    "{{ " + json.dumps(TOOLS_PREAMBLE) + " }}"
    "{% for tool in tools %}{{ '\\n' + (tool | tojson) }}{% endfor %}"
    "{{ " + json.dumps(TOOLS_EPILOGUE) + " + '<|im_end|>\\n' }}"
    "{% endif %}"
    "{% for message in messages[first:] %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + (message['content'] or '') + '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
"""`ToyChatTokenizer.render`'s ChatML (tools included) as a chat template."""


def write_tokenizer_files(directory: Path) -> None:
    """Write the three files into `directory` (created if missing; each file replaced whole)."""
    directory.mkdir(parents=True, exist_ok=True)
    vocab = dict(ToyChatTokenizer.SPECIALS)
    for code in range(0x110000):
        if not 0xD800 <= code <= 0xDFFF:  # surrogates are no characters
            vocab[chr(code)] = code + ToyChatTokenizer.OFFSET
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tokenizer.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in ToyChatTokenizer.SPECIALS])
    config = {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}
    _replace(directory / "tokenizer.json", lambda path: tokenizer.save(str(path)))
    _replace(directory / "chat_template.jinja", lambda path: path.write_text(CHAT_TEMPLATE, encoding="utf-8"))
    _replace(directory / "tokenizer_config.json", lambda path: path.write_text(json.dumps(config), encoding="utf-8"))


def _replace(path: Path, write: Callable[[Path], object]) -> None:
    """Write `path` through a temporary file beside it, so a reader never sees half of it."""
    partial = path.with_name(f".{path.name}.{os.getpid()}.partial")
    write(partial)
    partial.replace(path)

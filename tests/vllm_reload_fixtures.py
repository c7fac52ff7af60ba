"""The real vLLM (CPU build) with its development endpoints (VLLM_SERVER_DEV_MODE=1), so weight updates can
reload it from a checkpoint. Load with `pytest_plugins = ("vllm_reload_fixtures",)` and take `vllm`: the
session's one vLLM engine (engine_fixtures' `vllm_engine`; a start costs about 40 s), its starting weights
loaded back after each module. It skips where vLLM is not set up (or cannot run), and with
PRORL_REQUIRE_VLLM=1 (scripts/test.sh sets it where the setup succeeded) fails instead.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import pytest
from engine_fixtures import Engine, vllm_metrics

pytest_plugins = ("engine_fixtures",)


@dataclass
class ReloadableVllm:
    url: str  # http://host:port
    model_dir: str

    @property
    def address(self) -> str:
        return f"{self.url}/v1"

    def metrics(self) -> dict[str, float]:
        return vllm_metrics(self.url)

    def complete(self, prompt: str) -> str:
        body = {"prompt": prompt, "max_tokens": 2, "temperature": 0.0}
        answer = httpx.post(f"{self.url}/v1/completions", json=body, timeout=120, trust_env=False)
        assert answer.status_code == 200, answer.text
        return answer.json()["choices"][0]["text"]

    def restore(self) -> None:
        """Load the model it started with back and empty its prefix cache (a module may have left a trained
        checkpoint in it)."""
        body = {"method": "reload_weights", "kwargs": {"weights_path": self.model_dir}}
        for path, payload in (("/collective_rpc", body), ("/reset_prefix_cache", None)):
            answer = httpx.post(f"{self.url}{path}", json=payload, timeout=600, trust_env=False)
            assert answer.status_code == 200, f"{path}: {answer.status_code} {answer.text}"


@pytest.fixture(scope="module")
def vllm(reloadable_vllm: ReloadableVllm) -> Iterator[ReloadableVllm]:
    """The session's reloadable vLLM for one module (as a fresh engine was before), its starting weights
    loaded back at the module's end."""
    yield reloadable_vllm
    reloadable_vllm.restore()


@pytest.fixture(scope="session")
def reloadable_vllm(vllm_engine: Engine) -> ReloadableVllm:
    """The session's real vLLM of engine_fixtures (started with its development endpoints), reached directly."""
    from prorl_server.vllm_cpu import VllmCpuInstall

    return ReloadableVllm(vllm_engine.url, str(VllmCpuInstall.default().model))

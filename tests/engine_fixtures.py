"""The two real LLM engines the tests run against: the dev engine and the real vLLM (CPU build).

Load with `pytest_plugins = ("engine_fixtures",)` and take the `engine` fixture: each test using it runs once
per engine, so any difference between the dev engine and vLLM (the reference) shows up as a failing test.
Each engine starts once per test session, the first time a test needs it:

- `dev`: the dev engine in this process (SmolLM2-135M Q4_1 on llama.cpp), 2 slots, 4,096-token context;
- `vllm`: `vllm serve` from `scripts/setup-vllm.sh` (SmolLM2-135M float32), `--scheduling-policy priority
  --max-num-seqs 4`, 4,096-token context, behind a RecordingProxy that keeps its answers; with its
  development endpoints, as the one engine the weight-update tests reload too (vllm_reload_fixtures).

The vLLM tests skip where vLLM cannot run (not Linux x86_64 with AVX2) or is not set up; with
`PRORL_REQUIRE_VLLM=1` (set by scripts/test.sh where the setup succeeded) a missing vLLM fails instead.
"""

from __future__ import annotations

import os
import re
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from polling import wait_for

from prorl_server.testing import RecordingProxy, UvicornThread
from prorl_server.testing.uvicorn_thread import free_port

pytest_plugins = ("devllm_fixtures",)

ENGINES = ("dev", "vllm")
MODEL = "SmolLM2-135M-Instruct"
MAX_MODEL_LEN = 4096
VLLM_MAX_NUM_SEQS = 4
REQUIRE_VLLM_ENV = "PRORL_REQUIRE_VLLM"
_METRIC_LINE = re.compile(r"^(vllm:[a-z_]+)(?:\{[^}]*\})? (\S+)$", re.MULTILINE)


def vllm_metrics(url: str) -> dict[str, float]:
    """`GET {url}/metrics` of a vLLM engine: its `vllm:` series, each summed over its labels."""
    text = httpx.get(f"{url}/metrics", timeout=10, trust_env=False).raise_for_status().text
    totals: dict[str, float] = {}
    for name, value in _METRIC_LINE.findall(text):
        totals[name] = totals.get(name, 0.0) + float(value)
    return totals


@dataclass
class Engine:
    """A running engine as the tests see it.

    `url` is the engine itself (`http://host:port`); `address` is what prorl-server is given (`/v1`; for
    vLLM, through the recording proxy). `concurrency` requests generate at once (slots, or max-num-seqs).
    """

    kind: str
    url: str
    address: str
    concurrency: int
    _generations: Any = field(repr=False)

    model: str = MODEL
    max_model_len: int = MAX_MODEL_LEN

    def generations(self) -> list[Any]:
        """Every recorded request, oldest first, each with `prompt_ids`, `output_ids` and `logprobs`."""
        return list(self._generations())

    def assert_turns_are_its_own(self, segment: dict) -> None:
        """Each turn of a recorded `segment` has the ids and logprobs this engine sampled for exactly the ids
        that precede it (through the fixture, so that pytest, which imports this module, rewrites asserts)."""
        context = segment["prompt_ids"] + segment["response_ids"]
        generations = self.generations()
        for turn in segment["turns"]:
            prompt = context[: turn["prompt_len"]]
            record = next(g for g in reversed(generations) if g.prompt_ids == prompt)
            assert turn["output_ids"] == record.output_ids
            assert turn["logprobs"] == record.logprobs
            start = turn["prompt_len"] - len(segment["prompt_ids"])
            assert segment["response_ids"][start : start + len(record.output_ids)] == record.output_ids
            assert segment["response_mask"][start : start + len(record.output_ids)] == [1] * len(record.output_ids)

    def metrics(self) -> dict[str, float]:
        """`GET /metrics`, vLLM's names (each summed over its labels)."""
        return vllm_metrics(self.url)

    def running(self) -> int:
        """Requests generating now."""
        return int(self.metrics()["vllm:num_requests_running"])

    def waiting(self) -> int:
        """Requests queued for a slot."""
        return int(self.metrics()["vllm:num_requests_waiting"])

    def wait_idle(self, timeout: float = 180) -> None:
        """Wait until nothing runs or waits: the engine is shared by the session, and a request an earlier
        test walked away from may still be finishing its step."""
        wait_for(lambda: self.running() == 0 and self.waiting() == 0, timeout, f"{self.kind} engine idle")


@pytest.fixture(scope="session")
def dev_engine(dev_llm) -> Engine:
    """The dev engine of devllm_fixtures (2 slots), with its own record of what it sampled."""
    return Engine("dev", dev_llm.server.url, dev_llm.address, 2, dev_llm.generations)


@pytest.fixture(scope="session")
def vllm_engine() -> Iterator[Engine]:
    """The real vLLM, started once per session behind a recording proxy; stopped (by PID) at the end."""
    from prorl_server.vllm_cpu import VllmCpuInstall, VllmCpuSettings, VllmProcess, unsupported_reason

    required = os.environ.get(REQUIRE_VLLM_ENV) == "1"
    problem = unsupported_reason() or VllmCpuInstall.default().missing()
    if problem:
        if required:
            pytest.fail(f"{REQUIRE_VLLM_ENV}=1 but vLLM cannot start: {problem}")
        pytest.skip(f"the real vLLM is not available here: {problem}")
    # with its development endpoints: the weight-update tests reload this same engine (vllm_reload_fixtures)
    settings = VllmCpuSettings(
        port=free_port(), max_model_len=MAX_MODEL_LEN, max_num_seqs=VLLM_MAX_NUM_SEQS, weight_reload=True
    )
    with tempfile.TemporaryDirectory(prefix="prorl-test-vllm-") as logs:
        log = Path(logs) / "vllm.log"
        with VllmProcess(VllmCpuInstall.default(), settings, log=log) as vllm:
            proxy = RecordingProxy(vllm.base_url)
            # a session-long thread: named so the per-test thread-leak check does not count it
            with UvicornThread(proxy.app(), thread_name="session-vllm-recording-proxy") as server:
                yield Engine("vllm", vllm.base_url, f"{server.url}/v1", VLLM_MAX_NUM_SEQS, proxy.generations)


@pytest.fixture(params=ENGINES)
def engine(request: pytest.FixtureRequest) -> Engine:
    """Each engine in turn (the test runs once per engine)."""
    return request.getfixturevalue(f"{request.param}_engine")

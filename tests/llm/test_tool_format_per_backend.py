"""`--tool-call-format auto` per backend: the family is detected from the chat template of the backend's local
tokenizer, Hermes when there is none or it is not recognised; an explicit setting wins. End to end against a
real vLLM started with a Qwen3-Coder chat template (`--chat-template`) instead of its model's own."""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from engine_fixtures import REQUIRE_VLLM_ENV
from repo_paths import TEST_FIXTURES

from prorl_server import AgentHandler, JobContext
from prorl_server.agent import AgentLoop, bash_tool
from prorl_server.testing.uvicorn_thread import free_port
from prorl_server.tool_call_formats import FORMATS, HERMES, backend_format

TEMPLATES = TEST_FIXTURES / "chat_templates"
QWEN3_CODER = TEMPLATES / "qwen3_coder.jinja"
TOOLS = [{"type": "function", "function": {"name": "bash", "parameters": {"type": "object", "properties": {}}}}]


def test_auto_detects_the_family_and_an_explicit_setting_wins(caplog):
    qwen = QWEN3_CODER.read_text()
    assert backend_format("auto", qwen) is FORMATS["qwen3_coder"]
    assert backend_format("auto", (TEMPLATES / "mistral.jinja").read_text()).name == "mistral"
    assert backend_format("hermes", qwen) is HERMES and backend_format("mistral", None) is FORMATS["mistral"]
    with caplog.at_level(logging.WARNING):
        assert backend_format("auto", "{{ messages }} no tools here") is HERMES
        assert backend_format("auto", "{{ messages }} no tools here") is HERMES
    assert caplog.text.count("belongs to no known tool-call family") <= 1  # logged once per template
    assert backend_format("auto", None) is HERMES


class FormatProbe(AgentHandler):
    """Records the tool-call format the shared agent loop would use for the job."""

    name = "format_probe"

    async def run(self, ctx: JobContext) -> None:
        ctx.artifacts["format"] = (await AgentLoop([bash_tool()], "Solve it.").call_format(ctx)).name

    async def eval(self, ctx: JobContext) -> float:
        return 1.0


@pytest.fixture(scope="module")
def qwen_vllm() -> Iterator[str]:
    """A real vLLM serving SmolLM2 with the Qwen3-Coder chat template; its address."""
    from prorl_server.vllm_cpu import VllmCpuInstall, VllmCpuSettings, VllmProcess, unsupported_reason

    problem = unsupported_reason() or VllmCpuInstall.default().missing()
    if problem:
        if os.environ.get(REQUIRE_VLLM_ENV) == "1":
            pytest.fail(f"{REQUIRE_VLLM_ENV}=1 but vLLM cannot start: {problem}")
        pytest.skip(f"the real vLLM is not available here: {problem}")
    settings = VllmCpuSettings(
        port=free_port(), max_model_len=2048, max_num_seqs=2, extra_args=("--chat-template", str(QWEN3_CODER))
    )
    with (
        tempfile.TemporaryDirectory(prefix="prorl-test-vllm-qwen-") as logs,
        VllmProcess(VllmCpuInstall.default(), settings, log=Path(logs) / "vllm.log") as vllm,
    ):
        yield f"{vllm.base_url}/v1"


def qwen_model_dir(tmp_path: Path) -> Path:
    """SmolLM2's tokenizer with the Qwen3-Coder template: what the vLLM of `qwen_vllm` serves."""
    from prorl_server.vllm_cpu import VllmCpuInstall

    target = tmp_path / "qwen-smollm2"
    target.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(VllmCpuInstall.default().model / name, target / name)
    shutil.copy(QWEN3_CODER, target / "chat_template.jinja")
    return target


def run_probe(server) -> str:
    from server_jobs import result

    response = server.http.post("/jobs", json={"instance": {"data_source": "format_probe"}, "job_id": "probe"})
    assert response.status_code == 202, response.text
    finished = result(server, "probe", timeout=120)
    assert finished["status"] == "completed", finished
    return finished["artifacts"]["format"]


def gateway_rendering(server) -> str:
    """The content a harness-made assistant message with a call is recorded as, through a gateway session."""
    session = server.http.post("/sessions", json={"sampling_params": {"max_tokens": 2}}).json()
    call = {"id": "c1", "type": "function", "function": {"name": "bash", "arguments": json.dumps({"cmd": "ls"})}}
    messages = [
        {"role": "user", "content": "List the files."},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": "a.txt"},
    ]
    answer = httpx.post(
        f"{session['base_url']}/chat/completions",
        headers={"Authorization": f"Bearer {session['api_key']}"},
        json={"model": session["model"], "messages": messages, "tools": TOOLS},
        timeout=120,
    )
    assert answer.status_code == 200, answer.text
    record = server.http.delete(f"/sessions/{session['session_id']}").json()
    return record["segments"][0]["messages"][1]["content"]


def test_a_qwen3_coder_backend_gets_its_format_with_auto(qwen_vllm, start_server, tmp_path, caplog):
    # the model directory vLLM reports as root has SmolLM2's own template, not the one vLLM was started with
    plain = start_server([qwen_vllm], handlers={"format_probe": FormatProbe()})
    backend = plain.state.backends.backends()[0]
    assert run_probe(plain) == "hermes" and backend.tokenization == "backend"
    assert "differs" in caplog.text

    tokenizer = str(qwen_model_dir(tmp_path))
    detected = start_server([qwen_vllm], handlers={"format_probe": FormatProbe()}, tokenizer=tokenizer)
    assert run_probe(detected) == "qwen3_coder"
    assert detected.state.backends.backends()[0].tokenization == "local"
    assert "<function=bash>" in gateway_rendering(detected)

    explicit = start_server(
        [qwen_vllm], handlers={"format_probe": FormatProbe()}, tokenizer=tokenizer, tool_call_format="hermes"
    )
    assert run_probe(explicit) == "hermes"
    assert '<tool_call>\n{"name": "bash"' in gateway_rendering(explicit)

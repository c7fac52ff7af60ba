"""Chats tokenized in the server: against the real vLLM (SmolLM2-135M, its own tokenizer files) the local
tokenizer is chosen and gives the backend's ids; a template that differs from the backend's, or tokenizer
files that are missing or corrupt, fall back to the backend's /tokenize, logged and counted."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from prorl_server.llm import BackendPool, LLMSession, VLLMClient
from prorl_server.llm.chat_template import render_chat
from prorl_server.llm.errors import SessionFinished
from prorl_server.llm.local_tokenizer import TokenizerCache, find_tokenizer_dir, load_chat_tokenizer
from prorl_server.llm.session import missing_turn_close
from prorl_server.protocol import Trajectory

pytest_plugins = ("engine_fixtures",)

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "python",
            "description": "Run Python code and return what it prints.",
            "parameters": {"type": "object", "properties": {"code": {"type": "string"}}, "required": ["code"]},
        },
    }
]
CONVERSATION = [
    {"role": "system", "content": "You solve problems with tools. Résumé: ∑ 🙂"},
    {"role": "user", "content": "What is 2**10? <|im_end|> use python"},
]
OBSERVATIONS = [
    [{"role": "tool", "tool_call_id": "call_0", "content": "1024\n"}],
    [{"role": "user", "content": "Now 3**3, please."}, {"role": "tool", "content": "27"}],
]


class CountingClient(VLLMClient):
    """Counts the chat tokenizations it sends to a backend."""

    def __init__(self) -> None:
        super().__init__()
        self.chat_tokenizations = 0

    async def tokenize_messages(self, *args: Any, **kwargs: Any) -> list[int]:
        self.chat_tokenizations += 1
        return await super().tokenize_messages(*args, **kwargs)


def smollm2_dir() -> Path:
    from prorl_server.vllm_cpu import VllmCpuInstall

    return VllmCpuInstall.default().model


def model_copy(tmp_path: Path, **config: Any) -> Path:
    """SmolLM2's tokenizer files in a directory of their own, `config` written over its tokenizer config."""
    source, target = smollm2_dir(), tmp_path / "model"
    target.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        shutil.copy(source / name, target / name)
    if config:
        path = target / "tokenizer_config.json"
        path.write_text(json.dumps({**json.loads(path.read_text()), **config}))
    return target


async def test_vllm_backend_is_tokenized_in_the_server_with_identical_ids(vllm_engine):
    client = CountingClient()
    decisions: list[tuple[str, str]] = []
    pool = BackendPool(client, tokenizer_cache=TokenizerCache())
    pool.on_tokenization = lambda address, reason: decisions.append((address, reason))
    backend = pool.add(vllm_engine.address)
    session = LLMSession("local", pool, Trajectory(), {"temperature": 0.0, "max_tokens": 12})
    try:
        await pool.check_health()  # registration: the decision is made at the first passing health check
        assert backend.tokenization == "local" and decisions == [(backend.address, "local")]
        assert backend.chat_tokenizer is not None and backend.chat_tokenizer.directory == smollm2_dir().resolve()
        probes = client.chat_tokenizations

        await session.start(CONVERSATION, TOOLS)
        for observation in [*OBSERVATIONS, None]:
            turn = await session.generate()
            record = next(
                g for g in reversed(vllm_engine.generations()) if g.prompt_ids == session.token_ids[: turn.prompt_len]
            )
            assert turn.output_ids == record.output_ids
            if observation is not None:
                await session.add_messages(observation)
        assert client.chat_tokenizations == probes, "the session sent no /tokenize of its own"

        # the backend's own template of the whole conversation gives the session's stream
        messages = session.trajectory.messages
        full = await client.tokenize_messages(backend.address, None, messages, add_generation_prompt=False, tools=TOOLS)
        turn_close = await session.tokenize("<|im_end|>\n")
        assert session.token_ids + missing_turn_close(session.trajectory.turns[-1].output_ids, turn_close) == full

        # and every prefix of a conversation with tool calls, tokenized both ways
        calls = [{"id": "call_0", "type": "function", "function": {"name": "python", "arguments": '{"code": "1"}'}}]
        chat = [*CONVERSATION, {"role": "assistant", "content": "", "tool_calls": calls}, *OBSERVATIONS[0]]
        for n in range(1, len(chat) + 1):
            for generation_prompt in (False, True):
                ours = backend.chat_tokenizer.encode_chat(
                    chat[:n], add_generation_prompt=generation_prompt, tools=TOOLS
                )
                theirs = await client.tokenize_messages(
                    backend.address, None, chat[:n], add_generation_prompt=generation_prompt, tools=TOOLS
                )
                assert ours == theirs
    finally:
        session.finish()
        await client.aclose_current_loop()


async def test_a_template_that_differs_from_the_backends_falls_back_and_is_counted(
    vllm_engine, start_server, tmp_path, caplog
):
    template = (smollm2_dir() / "chat_template.jinja").read_text().replace("helpful AI assistant", "helpful robot")
    fake = model_copy(tmp_path)
    (fake / "chat_template.jinja").write_text(template)
    server = start_server([vllm_engine.address], tokenizer=str(fake))
    client = CountingClient()
    session = LLMSession("fallback", server.state.backends, Trajectory(), {"max_tokens": 4}, client=client)
    try:
        backend = server.state.backends.backends()[0]
        await server.state.backends.resolve_model(backend)
        assert backend.tokenization == "backend" and backend.chat_tokenizer is None
        assert "differs" in caplog.text and str(fake) in caplog.text
        samples = {
            (s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(server.http.get("/metrics").text)
            for s in family.samples
        }
        assert samples[("prorl_tokenizer_fallbacks_total", (("reason", "differs"),))] == 1
        assert samples[("prorl_backend_local_tokenizer", (("backend", backend.address),))] == 0
        assert server.http.get("/llm_servers").json()["servers"][0]["tokenization"] == "backend"
        await session.start(CONVERSATION)
        assert client.chat_tokenizations == 1, "the session tokenized with the backend's /tokenize"
    finally:
        session.finish()
        await client.aclose_current_loop()


@pytest.mark.parametrize("damage", ["missing", "corrupt", "bad_template"])
async def test_missing_or_corrupt_tokenizer_files_fall_back_cleanly(backend, tmp_path, damage):
    fake = model_copy(tmp_path) if (smollm2_dir() / "tokenizer.json").exists() else None
    if fake is None:
        pytest.skip("the converted SmolLM2 is not set up (scripts/setup-vllm.sh)")
    if damage == "missing":
        (fake / "tokenizer.json").unlink()
    elif damage == "corrupt":
        (fake / "tokenizer.json").write_text('{"version": "1.0", "model": ')
    else:
        (fake / "chat_template.jinja").write_text("{% for m in messages %}{{ m.content }")
    decisions: list[str] = []
    client = CountingClient()
    pool = BackendPool(client, tokenizer_cache=TokenizerCache(), tokenizer_path=str(fake))
    pool.on_tokenization = lambda _, reason: decisions.append(reason)
    pool.add(backend.address)
    session = LLMSession("broken", pool, Trajectory(), {"max_tokens": 4})
    try:
        await session.start([{"role": "user", "content": "hi"}])
        assert decisions == ["unloadable"] and client.chat_tokenizations == 1
        assert pool.backends()[0].tokenization == "backend"
    finally:
        session.finish()
        await client.aclose_current_loop()


def test_tokenizer_directory_order(tmp_path, monkeypatch):
    model = model_copy(tmp_path) if (smollm2_dir() / "tokenizer.json").exists() else None
    if model is None:
        pytest.skip("the converted SmolLM2 is not set up (scripts/setup-vllm.sh)")
    hub = tmp_path / "hub"
    snapshot = hub / "models--org--name" / "snapshots" / "abc"
    snapshot.parent.mkdir(parents=True)
    shutil.copytree(model, snapshot)
    (hub / "models--org--name" / "refs").mkdir()
    (hub / "models--org--name" / "refs" / "main").write_text("abc\n")
    monkeypatch.setenv("HF_HUB_CACHE", str(hub))
    assert find_tokenizer_dir("/explicit", str(model), "org/name") == (Path("/explicit"), "setting")
    assert find_tokenizer_dir(None, str(model), "org/name") == (model, "root")
    assert find_tokenizer_dir(None, "/not/a/dir", "org/name") == (snapshot, "hf_cache")
    assert find_tokenizer_dir(None, "org/name", "an-alias") == (snapshot, "hf_cache")  # root as a repository
    assert find_tokenizer_dir(None, "other/name", "an-alias") is None


def test_named_templates_and_the_hf_environment(tmp_path):
    if not (smollm2_dir() / "tokenizer.json").exists():
        pytest.skip("the converted SmolLM2 is not set up (scripts/setup-vllm.sh)")
    named = [
        {"name": "default", "template": "{% for m in messages %}{{ m.content }}{% endfor %}"},
        {"name": "tool_use", "template": "{{ tools | tojson }}|{{ bos_token }}"},
    ]
    fake = model_copy(tmp_path, chat_template=named)
    (fake / "chat_template.jinja").unlink()
    tokenizer = load_chat_tokenizer(fake)
    assert tokenizer.template_for(None) == named[0]["template"]
    assert tokenizer.template_for([]) == named[1]["template"]
    text = render_chat(
        "{%- for m in messages %}\n  {{ m.content | tojson(indent=1) }}{% if loop.first %}{% break %}{% endif %}\n"
        "{% endfor %}{{ strftime_now('%Y') | length }}{% if add_generation_prompt %}{{ raise_exception('no') }}"
        "{% endif %}",
        [{"role": "user", "content": "<é>"}, {"role": "user", "content": "x"}],
        add_generation_prompt=False,
    )
    assert text == '  "<é>"4'  # lstrip/trim blocks, tojson unescaped, loop controls, strftime_now
    with pytest.raises(Exception, match="no"):
        render_chat("{{ raise_exception('no') }}", [], add_generation_prompt=True)


async def test_the_simulators_tokenizer_files_are_used_in_the_server(tmp_path):
    from prorl_server.simllm import SimLLMServer

    client = CountingClient()
    pool = BackendPool(client, tokenizer_cache=TokenizerCache())
    with SimLLMServer(time_scale=1000, tokenizer_dir=str(tmp_path / "sim"), output_len_median=8) as sim:
        backend = pool.add(sim.address)
        session = LLMSession("sim", pool, Trajectory(), {"max_tokens": 8})
        try:
            await pool.check_health()
            assert backend.tokenization == "local" and backend.root == str(tmp_path / "sim")
            probes = client.chat_tokenizations
            await session.start(CONVERSATION, TOOLS)
            await session.generate()
            await session.add_messages(OBSERVATIONS[1])
            assert client.chat_tokenizations == probes
            ours = backend.chat_tokenizer.encode_chat(
                [*CONVERSATION, *OBSERVATIONS[1]], add_generation_prompt=True, tools=TOOLS
            )
            theirs = await client.tokenize_messages(
                backend.address, None, [*CONVERSATION, *OBSERVATIONS[1]], add_generation_prompt=True, tools=TOOLS
            )
            assert ours == theirs
            await session.generate()
            session.finish()
            with pytest.raises(SessionFinished):  # as when the backend tokenizes: the job has ended
                await session.add_messages(OBSERVATIONS[0])
        finally:
            session.finish()
            await client.aclose_current_loop()

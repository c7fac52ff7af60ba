"""Each harness preset tells its program the backend's context length where the session knows it (so that it
compacts before the gateway must refuse a call as too long), and nothing where it does not; and the job's
gateway access carries that length, the backend's `max_model_len`."""

from __future__ import annotations

import json

import pytest
from prorl_handlers.harnesses import HARNESSES, HarnessRun
from prorl_handlers.harnesses.opencode import CONTEXT_LIMIT
from repo_paths import DOCS

from prorl_server import AgentHandler, JobContext


def run(context_tokens: int | None) -> HarnessRun:
    return HarnessRun(
        task="t",
        model="m",
        base_url="http://127.0.0.1:8642/v1",
        api_key="k",
        max_turns=3,
        workdir="/workspace",
        home="/tmp/harness-home",
        context_tokens=context_tokens,
    )


def told(name: str, context_tokens: int | None) -> dict:
    """What preset `name` tells its program about the context: its variable, config key or limit."""
    harness = HARNESSES[name]()
    files, env = harness.files(run(context_tokens)), harness.env(run(context_tokens))
    if name == "claude_code":
        return {"env": env.get("CLAUDE_CODE_MAX_CONTEXT_TOKENS")}
    if name == "codex":
        [config] = files.values()
        return {"toml": [line for line in config.splitlines() if line.startswith("model_context_window")]}
    if name == "opencode":
        config = json.loads(files["/tmp/harness-home/.config/opencode/opencode.json"])
        return {"limit": config["provider"]["prorl"]["models"]["policy"]["limit"]}
    if name == "terminus":
        return {"config": json.loads(files["/tmp/harness-home/terminus.json"])["context_tokens"]}
    return {}


@pytest.mark.parametrize(
    ("name", "known", "unknown"),
    [
        ("claude_code", {"env": "32768"}, {"env": None}),
        ("codex", {"toml": ["model_context_window = 32768"]}, {"toml": []}),
        (
            "opencode",
            {"limit": {"context": 32768, "output": 8192}},
            {"limit": {"context": CONTEXT_LIMIT, "output": 16384}},
        ),
        ("terminus", {"config": 32768}, {"config": None}),
        ("mini_swe_agent", {}, {}),  # it never compacts
    ],
)
def test_a_preset_is_told_the_backend_s_context_where_it_is_known(name, known, unknown):
    assert told(name, 32768) == known
    assert told(name, None) == unknown


class AccessHandler(AgentHandler):
    """Opens the job's gateway session and keeps what it was given."""

    async def run(self, ctx: JobContext) -> None:
        access = await ctx.gateway_session()
        ctx.artifacts["context_tokens"] = access.context_tokens

    async def eval(self, ctx: JobContext) -> dict:
        return {"reward": 0.0}


def test_the_gateway_access_carries_the_backend_s_context_length(start_backend, start_server):
    double = start_backend(default_reply=None, max_model_len=12_345)
    server = start_server([double.address], handlers={"access": AccessHandler()})
    answer = server.http.post("/process", json={"instance": {"data_source": "access"}})
    assert answer.status_code == 200, answer.text
    assert answer.json()["artifacts"]["context_tokens"] == 12_345


def test_the_guide_s_example_preset_is_a_harness_an_instance_can_name(monkeypatch):
    """docs/harnesses.md, "Writing a harness": its class, registered as it says, makes a command and config."""

    from prorl_handlers.external_agent import ExternalAgentInstance
    from prorl_handlers.harnesses import HARNESSES

    guide = (DOCS / "harnesses.md").read_text()
    section = guide[guide.index("## Writing a harness") :]
    namespace: dict = {}
    exec(section.split("```python\n", 1)[1].split("```", 1)[0], namespace)
    preset = namespace["MyAgent"]
    monkeypatch.setitem(HARNESSES, preset.name, preset)
    instance = ExternalAgentInstance.model_validate({"harness": "my_agent", "task": "t", "score": {"command": "true"}})
    assert instance.harness == "my_agent"
    harness, given = preset(), run(32768)
    assert harness.command(given) == "/.prorl-harness/node_modules/.bin/my-agent --model m --max-steps 3 t"
    assert harness.env(given)["MY_AGENT_BASE_URL"] == given.base_url
    assert list(harness.files(given)) == ["/tmp/harness-home/.my-agent/config.json"]

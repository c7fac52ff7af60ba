"""Handlers are found through the entry-point group and through --handler targets."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from prorl_server.handlers import HandlerLoadError, HandlerRegistry, UnknownDataSource

PLUGIN = """
from prorl_server import AgentHandler

class Plugged(AgentHandler):
    async def run(self, ctx):
        return None

    async def eval(self, ctx):
        return 1.0
"""


@pytest.fixture
def installed_plugin(tmp_path, monkeypatch) -> Path:
    """A fake installed distribution with two entry points: one good, one pointing at a missing module."""
    (tmp_path / "plugged_pkg.py").write_text(PLUGIN)
    dist = tmp_path / "plugged_pkg-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: plugged-pkg\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text(
        "[prorl_server.handlers]\nplugged = plugged_pkg:Plugged\nbroken = not_a_module_xyz:Nope\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    sys.modules.pop("plugged_pkg", None)


def test_entry_point_plugins_load_by_data_source(installed_plugin):
    registry = HandlerRegistry()
    registry.load_entry_points()
    assert type(registry.get("plugged")).__name__ == "Plugged"
    assert "plugged" in registry.names() and "broken" not in registry.names()
    broken = next(e for e in registry.entries() if e.data_source == "broken")
    assert broken.handler is None and "not_a_module_xyz" in broken.error
    with pytest.raises(HandlerLoadError, match="failed to load"):
        registry.get("broken")


def test_broken_plugin_is_503_and_listed_with_its_error(installed_plugin, start_server, backend):
    from prorl_server.api import ServerState, create_app
    from prorl_server.config import ServerSettings
    from prorl_server.testing import UvicornThread

    state = ServerState.build(ServerSettings(llm_servers=[backend.address]))
    with UvicornThread(create_app(state=state)) as server:
        import httpx

        listed = {h["data_source"]: h for h in httpx.get(f"{server.url}/handlers").json()}
        assert listed["plugged"]["loaded"] and not listed["broken"]["loaded"]
        response = httpx.post(f"{server.url}/process", json={"instance": {"data_source": "broken"}})
        assert response.status_code == 503 and "not_a_module_xyz" in response.json()["detail"]
        ok = httpx.post(f"{server.url}/process", json={"instance": {"data_source": "plugged"}}, timeout=30)
        assert ok.json()["status"] == "completed"


def test_handler_targets_by_module_and_by_file(tmp_path):
    registry = HandlerRegistry()
    assert registry.add_target("handlers_for_tests:NoOpHandler") == "noop"
    plugin = tmp_path / "my_task.py"
    plugin.write_text(PLUGIN)
    assert registry.add_target(f"mytask={plugin}:Plugged") == "mytask"
    assert set(registry.names()) == {"noop", "mytask"}
    with pytest.raises(HandlerLoadError, match="no `name` class attribute"):
        registry.add_target(f"{plugin}:Plugged")
    with pytest.raises(HandlerLoadError, match="no attribute"):
        registry.add_target("handlers_for_tests:Missing")
    with pytest.raises(HandlerLoadError, match="cannot import"):
        registry.add_target("no_such_module_abc:X")
    with pytest.raises(HandlerLoadError, match="not a subclass"):
        registry.add_target("x=pathlib:Path")
    with pytest.raises(HandlerLoadError, match="must look like"):
        registry.add_target("nocolon")
    with pytest.raises(UnknownDataSource, match="known data sources: mytask, noop"):
        registry.get("other")

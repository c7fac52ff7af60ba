"""Runtime selection: `auto` prefers apptainer, then bubblewrap, then local with a loud warning."""

from __future__ import annotations

import logging

import pytest

from prorl_server.sandbox import CHOICES, SandboxError, available, make_runtime, new_owner_id, registry
from prorl_server.sandbox.local import LocalRuntime


def test_available_names_every_runtime_with_a_reason_or_none():
    found = available()
    assert set(found) == {"apptainer", "bwrap", "local", "podman"} == set(CHOICES) - {"auto"}
    assert found["local"] is None
    assert all(reason is None or (isinstance(reason, str) and reason) for reason in found.values())


def test_auto_takes_the_first_available_in_order(monkeypatch):
    reasons = {"apptainer": "not installed", "bwrap": None, "local": None}
    monkeypatch.setattr(registry, "unavailable_reason", reasons.__getitem__)
    assert registry.choose("auto") == "bwrap"
    reasons["apptainer"] = None
    assert registry.choose("auto") == "apptainer"


def test_auto_never_picks_podman(monkeypatch):
    reasons = {"apptainer": "not installed", "bwrap": "not installed", "local": None, "podman": None}
    monkeypatch.setattr(registry, "unavailable_reason", reasons.__getitem__)
    assert registry.choose("auto") == "local"
    assert registry.choose("podman") == "podman"


def test_auto_falls_back_to_local_loudly(monkeypatch, caplog):
    reasons = {"apptainer": "apptainer not found", "bwrap": "bubblewrap is not installed", "local": None}
    monkeypatch.setattr(registry, "unavailable_reason", reasons.__getitem__)
    with caplog.at_level(logging.WARNING):
        runtime = make_runtime("auto", new_owner_id())
    assert isinstance(runtime, LocalRuntime)
    text = caplog.text
    assert "NO SANDBOX ISOLATION" in text and "bubblewrap is not installed" in text and "NO isolation" in text


def test_an_unknown_or_unavailable_runtime_is_refused_with_the_reason(monkeypatch):
    with pytest.raises(SandboxError, match="unknown sandbox runtime 'docker'; choose one of auto, apptainer"):
        make_runtime("docker", new_owner_id())
    monkeypatch.setattr(registry, "unavailable_reason", lambda name: "bubblewrap is not installed")
    with pytest.raises(SandboxError, match="'bwrap' is not available: bubblewrap is not installed"):
        make_runtime("bwrap", new_owner_id())


@pytest.mark.skipif(registry.unavailable_reason("bwrap") is not None, reason="bubblewrap is not available here")
def test_bwrap_is_available_here_when_installed():
    assert registry.choose("bwrap") == "bwrap"

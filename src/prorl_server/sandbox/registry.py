"""Runtime selection by name (`--runtime auto|apptainer|bwrap|local|podman`).

`auto` takes the first available of apptainer (or singularity), bubblewrap, local; falling back to local
logs a loud warning with the reasons the others are unavailable. Podman is used only when named: its images
are podman's own or root directories, not the host root `auto`'s other choices also run. Runtimes are
imported only when asked for.
"""

from __future__ import annotations

import importlib
import logging
from typing import Any

from prorl_server.config import RUNTIME_NAMES, RuntimeName
from prorl_server.sandbox.base import Runtime
from prorl_server.sandbox.errors import SandboxError

log = logging.getLogger(__name__)

CHOICES = RUNTIME_NAMES  # declared once, in config.py
AUTO_ORDER = ("apptainer", "bwrap", "local")
RUNTIMES: dict[RuntimeName, str] = {  # one implementation per name of CHOICES but auto
    "apptainer": "prorl_server.sandbox.apptainer:ApptainerRuntime",
    "bwrap": "prorl_server.sandbox.bwrap:BwrapRuntime",
    "local": "prorl_server.sandbox.local:LocalRuntime",
    "podman": "prorl_server.sandbox.podman:PodmanRuntime",
}


def runtime_class(name: str) -> type[Runtime]:
    """The Runtime class registered under `name`."""
    if name not in RUNTIMES:
        raise SandboxError(f"unknown sandbox runtime {name!r}; choose one of {', '.join(CHOICES)}")
    module, _, attr = RUNTIMES[name].partition(":")
    return getattr(importlib.import_module(module), attr)


def unavailable_reason(name: str) -> str | None:
    """None if runtime `name` can work on this machine, else why not."""
    try:
        return runtime_class(name).available()
    except ImportError as exc:
        return f"the {name} runtime cannot be loaded: {exc}"


def available() -> dict[str, str | None]:
    """Every runtime's `unavailable_reason` (None = available)."""
    return {name: unavailable_reason(name) for name in RUNTIMES}


def choose(name: str = "auto", exclude: tuple[str, ...] = ()) -> str:
    """Resolve `auto` (skipping `exclude`), or check that the named runtime is available; raises SandboxError
    with the reason."""
    if name != "auto":
        reason = unavailable_reason(name)
        if reason is not None:
            raise SandboxError(f"sandbox runtime {name!r} is not available: {reason}")
        return name
    reasons = {}
    for candidate in (c for c in AUTO_ORDER if c not in exclude):
        reasons[candidate] = unavailable_reason(candidate)
        if reasons[candidate] is None:
            if candidate == "local":
                why = "; ".join(f"{k}: {v}" for k, v in reasons.items() if v)
                log.warning("NO SANDBOX ISOLATION: --runtime auto fell back to 'local' (%s)", why)
            return candidate
    raise SandboxError("no sandbox runtime is available")  # unreachable: local always is


def make_runtime(name: str, owner: str, exclude: tuple[str, ...] = (), **options: Any) -> Runtime:
    """A runtime for server instance `owner` (see reaper.new_owner_id); `options` go to its constructor."""
    chosen = choose(name, exclude)
    log.info("sandbox runtime: %s", chosen)
    return runtime_class(chosen)(owner, **options)

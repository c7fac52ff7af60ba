"""Podman containers by owner label, for the reaper: which owners have some, and removing an owner's.

Kept apart from podman.py (the runtime) so the reaper can use it without importing the runtime. Every call
is a no-op, without running podman, where podman is not installed. A podman call costs 50 ms and more, so the
podman runtime leaves a marker (`MARKER`) in its owner's private directory, and an owner's containers are
looked for only where it is (`used`): the other runtimes' owners cost no podman call.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

ENV_BINARY = "PRORL_PODMAN"  # path of the podman binary; else `podman` on PATH
LABEL = "prorl.owner"  # on every sandbox container: the owner id of the server that started it
REMOVE_TIMEOUT_S = 30.0
MARKER = "podman-containers"  # in <base dir>/<owner>/: this owner started podman containers


def mark(owner_dir: Path) -> None:
    """Record in an owner's private directory (made if missing, mode 0700) that it starts podman containers."""
    owner_dir.mkdir(mode=0o700, exist_ok=True)
    (owner_dir / MARKER).touch()


def used(owner_dir: Path) -> bool:
    """Whether the owner of this private directory started podman containers."""
    return (owner_dir / MARKER).exists()


def find_podman() -> str | None:
    """The podman binary: $PRORL_PODMAN, else `podman` on PATH."""
    configured = os.environ.get(ENV_BINARY)
    if configured:
        return configured if os.access(configured, os.X_OK) else None
    return shutil.which("podman")


def _listed(binary: str, label: str, template: str) -> list[str]:
    """`podman ps -a` of containers with `label`, one formatted line each (empty if podman fails)."""
    try:
        listed = subprocess.run(
            [binary, "ps", "-a", "--filter", f"label={label}", "--format", template],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=REMOVE_TIMEOUT_S,
        )
    except (OSError, subprocess.TimeoutExpired):
        return []
    return listed.stdout.split() if listed.returncode == 0 else []


def container_owners() -> set[str]:
    """Owner ids on the podman containers here."""
    binary = find_podman()
    return set() if binary is None else set(_listed(binary, LABEL, f'{{{{index .Labels "{LABEL}"}}}}'))


def owner_containers(owner: str) -> list[str]:
    """Names of the podman containers labelled with `owner`, running or not."""
    binary = find_podman()
    return [] if binary is None else _listed(binary, f"{LABEL}={owner}", "{{.Names}}")


def remove_containers(owner: str) -> list[str]:
    """`podman rm -f` every container labelled with `owner`; returns their names."""
    binary = find_podman()
    names = owner_containers(owner)
    if binary is not None and names:
        try:
            subprocess.run(
                [binary, "rm", "-f", "-t", "0", "--ignore", *names],
                stdin=subprocess.DEVNULL,
                capture_output=True,
                timeout=REMOVE_TIMEOUT_S,
            )
        except (OSError, subprocess.TimeoutExpired):
            return []
    return names

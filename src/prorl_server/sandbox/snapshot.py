"""Snapshots: an initialised sandbox's writable state, kept on the host as the read-only lower layer of its forks.

`Runtime.snapshot(sandbox)` stops a sandbox and keeps what it wrote; `Runtime.fork(snapshot)` starts a new
sandbox of the same spec whose writable state is an overlay: a fresh, private upper layer of its own over the
snapshot as lower layer, so a fork reads the snapshot's files and writes only into its upper layer (copy on
write); the snapshot never changes. What a snapshot holds is per runtime:

- bubblewrap: a copy of each of the sandbox's own writable mounts (its working directory, /tmp, /dev/shm,
  an image's /var/tmp), made while its processes are stopped, in `<n>/` for the mount `layers[n]`;
- Apptainer: the sandbox's overlay (its ext3 image, or its directory with `disk_mb=None`), moved aside.

A snapshot lives in `<sandboxes' directory>/<owner>/snap-<id>/` (bubblewrap's in memory, under
`reaper.MEMORY_SNAPSHOT_DIR` on /dev/shm, as the sandbox's writable mounts were) with a manifest written last; `check()`
refuses one whose directory, manifest or layers are gone or do not match (SandboxError), and `remove()`
deletes it. Processes are never part of a snapshot: a fork starts with its execution server alone.
"""

from __future__ import annotations

import json
import shutil
import uuid
from dataclasses import dataclass
from pathlib import Path

from prorl_server.sandbox.errors import SandboxError
from prorl_server.sandbox.private_dir import ensure_private_dir
from prorl_server.sandbox.spec import SandboxSpec

MANIFEST = "snapshot.json"
PREFIX = "snap-"


@dataclass(frozen=True)
class Snapshot:
    """One snapshot (see the module docstring): which runtime made it, from which spec, where, and its layers
    (bubblewrap: the writable paths copied, in `<n>/`; Apptainer: the overlay's file or directory name)."""

    id: str
    runtime: str
    spec: SandboxSpec
    directory: Path
    layers: tuple[str, ...]

    def layer(self, index: int) -> Path:
        """Where layer `index` is on the host: `<directory>/<n>` (bubblewrap) or the overlay (Apptainer)."""
        return self.directory / (str(index) if self.runtime == "bwrap" else self.layers[index])

    def manifest(self) -> dict[str, object]:
        """What `write_manifest` records and `check` compares."""
        return {"id": self.id, "runtime": self.runtime, "layers": list(self.layers)}

    def write_manifest(self) -> None:
        """Record the snapshot as complete (written last, after every layer)."""
        (self.directory / MANIFEST).write_text(json.dumps(self.manifest()))

    def check(self) -> None:
        """SandboxError, saying what is wrong, unless the snapshot is there, complete and the one expected."""
        try:
            recorded = json.loads((self.directory / MANIFEST).read_text())
        except FileNotFoundError:
            raise SandboxError(
                f"snapshot {self.id} is gone: its manifest {self.directory / MANIFEST} does not exist"
            ) from None
        except (OSError, ValueError) as exc:
            raise SandboxError(f"snapshot {self.id} is corrupt: its manifest cannot be read ({exc})") from None
        if recorded != self.manifest():
            raise SandboxError(f"snapshot {self.id} is corrupt: its manifest says {recorded}, not {self.manifest()}")
        for index in range(len(self.layers)):
            if not self.layer(index).exists():
                raise SandboxError(f"snapshot {self.id} is corrupt: its layer {self.layer(index)} is missing")

    def remove(self) -> None:
        """Delete the snapshot's files (idempotent)."""
        shutil.rmtree(self.directory, ignore_errors=True)


def new_snapshot_dir(base_dir: Path, owner: str) -> tuple[str, Path]:
    """A fresh snapshot id and its empty directory `<base_dir>/<owner>/snap-<id>/` (mode 0700; the reaper
    removes `<owner>/` under DEFAULT_BASE_DIR and MEMORY_SNAPSHOT_DIR)."""
    snapshot_id = uuid.uuid4().hex[:12]
    ensure_private_dir(base_dir)
    (base_dir / owner).mkdir(mode=0o700, exist_ok=True)
    directory = base_dir / owner / f"{PREFIX}{snapshot_id}"
    directory.mkdir(mode=0o700)
    return snapshot_id, directory

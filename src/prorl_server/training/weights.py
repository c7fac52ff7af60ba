"""Push a trainer's new weights to the engines: save a checkpoint, make every engine reload it, timed.

`CheckpointSync.push(model, version)` writes the policy with `save_pretrained` (safetensors, the layout
`vllm serve` loads) into `<directory>/v<version>`, then on every server of the client LLM dispatching
pauses (calls in flight finish, or are aborted with `mode="abort"`), each engine loads the checkpoint and
resets its prefix cache, the version is set, and dispatching resumes (`POST /weights/pause`,
`/weights/update` with `reload`, `/weights/resume`). The engines read the path themselves, so `directory` must be visible to them (on one node, `/dev/shm` is the
fastest; on a cluster, a shared file system).

The previous checkpoint is kept until the next one is loaded (the server rolls an engine back to it when a
reload fails); older ones are deleted.
"""

from __future__ import annotations

import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from prorl_server.client import RolloutServerError, SyncRolloutClient
from prorl_server.errors import TrainerError


class WeightSyncError(TrainerError, RuntimeError):
    """The engines could not load a checkpoint; they serve the previous weights under the previous version."""


@dataclass(frozen=True)
class SyncTiming:
    """Where one push went and how long its two halves took."""

    version: int
    path: Path
    save_s: float
    reload_s: float  # pause, engines reload, version set, resume

    @property
    def total_s(self) -> float:
        return self.save_s + self.reload_s


class CheckpointSync:
    """Saves the policy under `directory` and makes the client's servers' engines reload it."""

    def __init__(self, client: SyncRolloutClient, directory: Path, *, mode: str = "wait", keep: int = 2) -> None:
        if keep < 2:
            raise ValueError("keep at least 2 checkpoints: the server rolls a failed engine back to the previous one")
        self.client = client
        self.directory = Path(directory)
        self.mode = mode
        self.keep = keep
        self._pushed: list[Path] = []

    def push(self, model: torch.nn.Module, version: int) -> SyncTiming:
        """Save `model` as version `version` and reload it in every engine. WeightSyncError when an engine
        refuses it: dispatching is resumed under the previous weights before it is raised."""
        path = self.directory / f"v{version}"
        started = time.monotonic()
        model.save_pretrained(path, safe_serialization=True)
        saved = time.monotonic()
        self.reload(path, version)
        timing = SyncTiming(version, path, saved - started, time.monotonic() - saved)
        self._pushed.append(path)
        for old in self._pushed[: -self.keep]:
            shutil.rmtree(old, ignore_errors=True)
        self._pushed = self._pushed[-self.keep :]
        return timing

    def reload(self, path: Path, version: int) -> None:
        """Pause dispatching (calls in flight finish, or are aborted with mode "abort"), make every engine of
        every server load `path` as `version`, resume. WeightSyncError when an engine refuses it: the server
        has put every engine back on the previous weights, and dispatching resumes under them."""
        self.client.weights.pause(self.mode)
        try:
            self.client.weights.update(version, reload_path=str(path))
        except RolloutServerError as exc:
            raise WeightSyncError(
                f"the engines could not load the checkpoint {path} as version {version}; rollouts go on with the "
                f"previous weights: {exc.detail or exc}"
            ) from exc
        finally:
            try:
                self.client.weights.resume()
            except RolloutServerError as exc:
                if exc.status_code != 409:  # 409: not paused any more (its lease ran out): nothing held back
                    raise

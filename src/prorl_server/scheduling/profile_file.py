"""The profile file: a backend's per-token time by batch size and its prefill cost, as measured.

`prorl-server profile-backend URL --out FILE` writes one (`backend_profiler.py`); the `presorted_dp` placement
(`--interference-profile FILE`, `--backend-profile ADDRESS=FILE`) and the LLM simulator (`sim-llm --profile
FILE`) read it. JSON::

    {"format": "prorl-server-profile/1", "points": [[1, 0.012], [2, 0.014], ...],
     "prefill_s_per_token": 0.0003, "model_parallel": 1, "backend": "http://...", "model": "...",
     "measured_at": "2026-11-26T20:30:00Z", "method": "how the points were obtained"}

`points` are (batch size, seconds per generated token) with batch sizes strictly increasing; only `format`
and `points` are required. A file is untrusted input: it is read up to `MAX_FILE_BYTES`, and anything
malformed is a `ValueError` naming the file.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from prorl_server.scheduling.profile import Profile

FORMAT = "prorl-server-profile/1"
MAX_FILE_BYTES = 64 * 1024
MAX_POINTS = 256

Text = Annotated[str, Field(max_length=4096)]


class ProfileFile(BaseModel):
    """A measured (or declared) interference profile of one backend."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    format: Literal["prorl-server-profile/1"]
    points: tuple[tuple[int, float], ...] = Field(min_length=1, max_length=MAX_POINTS)
    prefill_s_per_token: float | None = Field(default=None, ge=0, le=10)
    model_parallel: int = Field(default=1, ge=1, le=4096)
    backend: Text = ""
    model: Text = ""
    measured_at: Text = ""
    method: Text = ""

    @field_validator("points")
    @classmethod
    def _check_points(cls, points: tuple[tuple[int, float], ...]) -> tuple[tuple[int, float], ...]:
        previous = 0
        for batch, seconds in points:
            if batch <= previous:
                raise ValueError(f"batch sizes must be >= 1 and strictly increasing, got {batch} after {previous}")
            if not (math.isfinite(seconds) and 0 < seconds <= 3600):
                raise ValueError(f"seconds per token must be finite, > 0 and <= 3600, got {seconds}")
            previous = batch
        return points

    def profile(self) -> Profile:
        """The points as a scheduling `Profile`."""
        return Profile.from_points(self.points)

    def points_text(self) -> str:
        """The points as `batch:seconds,...` (the `--profile` syntax)."""
        return ",".join(f"{batch}:{seconds:.6g}" for batch, seconds in self.points)


def read_profile_file(path: str | Path) -> ProfileFile:
    """Read and check a profile file; `ValueError` naming the file when it is missing, too large or malformed."""
    path = Path(path)
    try:
        with path.open("rb") as handle:
            data = handle.read(MAX_FILE_BYTES + 1)
    except OSError as exc:
        raise ValueError(f"profile file {path}: {exc.strerror or exc}") from None
    if len(data) > MAX_FILE_BYTES:
        raise ValueError(f"profile file {path} is larger than {MAX_FILE_BYTES} bytes")
    try:
        return ProfileFile.model_validate(json.loads(data))
    except (ValueError, ValidationError) as exc:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise ValueError(f"profile file {path} is not a {FORMAT} profile: {exc}") from None


def is_profile_path(value: str) -> bool:
    """True when a `--profile`-style value names a file rather than `batch:seconds` points: it ends in `.json`
    or names an existing file."""
    return value.endswith(".json") or Path(value).is_file()

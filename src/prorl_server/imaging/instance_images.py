"""Per-instance images: a repository's base image plus a small instance layer, built through a BuildQueue into
an ImageCache.

An instance of a SWE-bench-style dataset may name, relative to the dataset's directory, its own
`dockerfile` and the `base_dockerfile` of its repository (`ImageSpec.from_instance`); a path that leaves the
dataset's directory is refused. The base is built from its Dockerfile (`imaging/dockerfile.py`, FROM mapped
by `base_map`) once per content, and every instance of the repository builds on it: the instance Dockerfile's
FROM is replaced by the built base (`Bootstrap: localimage`), so its image is the base plus the instance's own
steps. Without a base the instance Dockerfile is built on its own FROM. Instances whose images build
concurrently share the base's build (ImageBuilder's lock on its cache entry: the second waits, then reuses
it); requests for the same instance share one build (BuildQueue).
"""

from __future__ import annotations

import dataclasses
import hashlib
import time
from collections.abc import Mapping
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prorl_server.errors import ImageError
from prorl_server.imaging.build_queue import BuildQueue
from prorl_server.imaging.dockerfile import Conversion, build_dockerfile, convert
from prorl_server.imaging.image_cache import ImageCache, ImageLease
from prorl_server.imaging.images import DEFAULTS, BuiltImage, ImageBuilder, ImageBuildError

LEASE_TRIES = 3  # builds of an image evicted by another process between its build and the lease


class ImageSpecError(ImageError, ValueError):
    """An instance's image fields are malformed or name a file outside its dataset."""


@dataclass(frozen=True)
class ImageSpec:
    """An instance's image: its Dockerfile (whose directory is its build context) and its repository's base."""

    dockerfile: Path
    base_dockerfile: Path | None = None

    @classmethod
    def from_instance(cls, instance: Mapping[str, Any], dataset_dir: Path) -> ImageSpec | None:
        """The spec of an instance's `dockerfile` and `base_dockerfile` fields (None without `dockerfile`)."""
        name, base = instance.get("dockerfile"), instance.get("base_dockerfile")
        if name is None:
            if base is not None:
                raise ImageSpecError("base_dockerfile needs a dockerfile (the instance's layer on the base)")
            return None
        return cls(
            dataset_file(dataset_dir, name, "dockerfile"), base and dataset_file(dataset_dir, base, "base_dockerfile")
        )

    @property
    def key(self) -> str:
        """The queue's key: which files the image is built from."""
        return hashlib.sha256(f"{self.dockerfile}\0{self.base_dockerfile}".encode()).hexdigest()[:16]


def dataset_file(dataset_dir: Path, name: object, field: str) -> Path:
    """`name`, a relative path inside `dataset_dir` (links resolved), as an existing file."""
    if not isinstance(name, str) or not name:
        raise ImageSpecError(f"{field} must be a path relative to the dataset's directory, not {name!r}")
    root = dataset_dir.resolve()
    path = (root / name).resolve()
    if Path(name).is_absolute() or not path.is_relative_to(root):
        raise ImageSpecError(f"{field} {name!r} is outside the dataset's directory {root}")
    if not path.is_file():
        raise ImageSpecError(f"{field} {name!r}: no such file in the dataset's directory {root}")
    return path


@dataclass(frozen=True)
class InstanceImage:
    """A built instance image: the .sif, the Dockerfile's WORKDIR, and how it was got."""

    path: Path
    workdir: str
    cached: bool  # the instance layer was built before
    base_cached: bool | None  # the base was built before (None: no base)
    seconds: float


class InstanceImages:
    """Builds instance images with at most `queue.limit` builds at once, kept within `cache`'s budget."""

    def __init__(
        self,
        builder: ImageBuilder,
        queue: BuildQueue[InstanceImage],
        cache: ImageCache,
        base_map: Mapping[str, Path] | None = None,
        mirror: str = DEFAULTS["mirror"],
    ) -> None:
        self.builder, self.queue, self.cache = builder, queue, cache
        self.base_map = dict(base_map or {})
        self.mirror = mirror

    def submit(self, spec: ImageSpec) -> Future[InstanceImage]:
        """The future of `spec`'s image, built (or found) in the queue."""
        return self.queue.submit(spec.key, lambda: self.build(spec))

    async def acquire(self, spec: ImageSpec) -> tuple[InstanceImage, ImageLease]:
        """`spec`'s image and a lease on it (release it when no sandbox uses the image any more)."""
        for _ in range(LEASE_TRIES):
            image = await self.queue.build(spec.key, lambda: self.build(spec))
            try:
                return image, self.cache.lease(image.path)
            except FileNotFoundError:
                continue  # evicted by another process since it was built: build it again
        raise ImageBuildError(f"{spec.dockerfile}: its image was evicted {LEASE_TRIES} times before it could be used")

    def build(self, spec: ImageSpec) -> InstanceImage:
        """Build (or find) the base, then the instance layer on it; then evict what the budget leaves no room for."""
        started = time.perf_counter()
        conversion = convert(spec.dockerfile, base_map=self.base_map)
        base_cached, base_lease = None, None
        try:
            if spec.base_dockerfile is not None:
                base, base_lease = self._leased(convert(spec.base_dockerfile, base_map=self.base_map))
                base_cached = base.cached
                conversion = dataclasses.replace(conversion, base=base.path, docker=None, suite=None)
            built, lease = self._leased(conversion)
            with lease:
                self.cache.evict()
        finally:
            if base_lease is not None:
                base_lease.release()
        return InstanceImage(built.path, conversion.workdir, built.cached, base_cached, time.perf_counter() - started)

    def _leased(self, conversion: Conversion) -> tuple[BuiltImage, ImageLease]:
        """The image of `conversion`, built (or found), and a lease on it."""
        for _ in range(LEASE_TRIES):
            built = build_dockerfile(self.builder, conversion, mirror=self.mirror)
            try:
                return built, self.cache.lease(built.path)
            except FileNotFoundError:
                continue  # evicted by another process since it was built: build it again
        raise ImageBuildError(f"{conversion.dockerfile}: its image was evicted {LEASE_TRIES} times before it was used")

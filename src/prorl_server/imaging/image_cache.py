"""ImageCache: the built images of an image cache directory kept within a size budget, least recently used
first out, never one in use.

An image is a `.sif` at the top of the cache directory (what `ImageBuilder` builds: `<name>-<key>.sif`,
beside its `.json`, `.log` and `.lock`). Using one takes a lease (`lease`): a shared `fcntl.flock` on its
`.use` file, held until released, whose mtime the lease also sets, so that mtime is when the image was last
used (its build time if never). `evict` removes the least recently used images until the `.sif` files fit the
budget, each only while it holds, without waiting, the exclusive lock on its `.lock` (no process is building
or looking the image up) and on its `.use` (no process uses it). Those locks are per open file, so they
protect images across threads and across the processes of one node alike. With an image go its `.json` and
`.log`, and its unpacked root directory (`unpack_sif` into the same cache directory); the lock files stay.
A process that finds its image evicted between the build's lookup and its lease builds it again
(`lease` raises FileNotFoundError).
"""

from __future__ import annotations

import fcntl
import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from prorl_server.sandbox import unpacked_path


@dataclass(frozen=True)
class CacheState:
    """What the cache holds: images, their bytes (the .sif files), how many are in use, and the budget."""

    images: int
    bytes: int
    in_use: int
    budget_bytes: int | None


class ImageLease:
    """A use of a cached image: while held (until `release`), `ImageCache.evict` leaves the image alone."""

    def __init__(self, image: Path, handle: IO[str]) -> None:
        self.image = image
        self._handle: IO[str] | None = handle

    def release(self) -> None:
        """End the use (idempotent)."""
        if self._handle is not None:
            self._handle.close()  # closing the file drops its lock
            self._handle = None

    def __enter__(self) -> ImageLease:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


class ImageCache:
    """The `.sif` images at the top of `cache_dir`, kept within `budget_bytes` (None: no budget) by `evict`."""

    def __init__(self, cache_dir: Path, budget_bytes: int | None = None) -> None:
        self.cache_dir = cache_dir
        self.budget_bytes = budget_bytes

    def images(self) -> list[Path]:
        """The cached images, least recently used first."""
        return sorted(self.cache_dir.glob("*.sif"), key=self._last_used)

    def lease(self, image: Path) -> ImageLease:
        """Take a lease on `image` and mark it used now; FileNotFoundError if it is not (or no longer) there."""
        handle = open(image.with_suffix(".use"), "a")  # noqa: SIM115 - held by the lease
        fcntl.flock(handle, fcntl.LOCK_SH)
        if not image.is_file():
            handle.close()
            raise FileNotFoundError(f"{image} is not in the image cache (evicted?)")
        os.utime(handle.fileno())
        return ImageLease(image, handle)

    def state(self) -> CacheState:
        """Counts and bytes of the cache now."""
        images = self.images()
        sizes = [_size(image) for image in images]
        in_use = 0
        for image in images:
            with _try_lock(image.with_suffix(".use")) as free:
                in_use += not free
        return CacheState(len(images), sum(sizes), in_use, self.budget_bytes)

    def evict(self) -> list[Path]:
        """Remove least recently used images not in use until the rest fit the budget; the images removed."""
        if self.budget_bytes is None:
            return []
        images = self.images()
        total = sum(_size(image) for image in images)
        evicted = []
        for image in images:
            if total <= self.budget_bytes:
                break
            size = _size(image)
            if self._remove(image):
                total -= size
                evicted.append(image)
        return evicted

    def _remove(self, image: Path) -> bool:
        """Remove `image` and what belongs to it if nobody builds, looks up or uses it; whether it did."""
        with _try_lock(image.with_suffix(".lock")) as unbuilt, _try_lock(image.with_suffix(".use")) as unused:
            if not (unbuilt and unused and image.is_file()):
                return False
            unpacked = unpacked_path(image, self.cache_dir)
            for suffix in (".json", ".log"):
                image.with_suffix(suffix).unlink(missing_ok=True)
            image.unlink()
            shutil.rmtree(unpacked, ignore_errors=True)
            return True

    def _last_used(self, image: Path) -> float:
        """When `image` was last leased, else built (0 if it is gone)."""
        for path in (image.with_suffix(".use"), image):
            try:
                return path.stat().st_mtime
            except FileNotFoundError:
                continue
        return 0.0


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


@contextmanager
def _try_lock(path: Path) -> Iterator[bool]:
    """An exclusive lock on `path` if it can be had at once: yields whether it was."""
    with open(path, "a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        yield True

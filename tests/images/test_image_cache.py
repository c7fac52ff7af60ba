"""ImageCache: least recently used images out until the .sif files fit the budget; an image leased (in use, in
this process or another) or locked by a build is never evicted; the state counts images, bytes and leases."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from prorl_server.imaging import ImageCache
from prorl_server.imaging.images import _locked
from prorl_server.sandbox.apptainer import unpacked_path

MIB = 1 << 20


def image(cache_dir: Path, name: str, mib: int, used_at: float) -> Path:
    """A cached image of `mib` MiB with its key file and log, last used at `used_at` (its .use file's mtime)."""
    path = cache_dir / f"{name}.sif"
    with open(path, "wb") as f:
        f.truncate(mib * MIB)
    path.with_suffix(".json").write_text("{}")
    path.with_suffix(".log").write_text("built")
    path.with_suffix(".use").touch()
    os.utime(path.with_suffix(".use"), (used_at, used_at))
    return path


def names(paths: list[Path]) -> list[str]:
    return [path.stem for path in paths]


def test_least_recently_used_images_go_first_until_the_rest_fit(tmp_path: Path):
    for name, used_at in (("c", 3000), ("a", 1000), ("d", 4000), ("b", 2000)):
        image(tmp_path, name, 10, used_at)
    unpacked = unpacked_path(tmp_path / "a.sif", tmp_path)
    (unpacked / "etc").mkdir(parents=True)
    cache = ImageCache(tmp_path, budget_bytes=25 * MIB)
    assert names(cache.images()) == ["a", "b", "c", "d"]
    assert names(cache.evict()) == ["a", "b"]
    assert names(cache.images()) == ["c", "d"] and not unpacked.exists()
    assert not (tmp_path / "a.json").exists() and not (tmp_path / "a.log").exists()
    assert cache.evict() == []
    state = cache.state()
    assert (state.images, state.bytes, state.in_use, state.budget_bytes) == (2, 20 * MIB, 0, 25 * MIB)


def test_a_lease_marks_an_image_used_and_keeps_it(tmp_path: Path):
    old, new = image(tmp_path, "old", 10, 1000), image(tmp_path, "new", 10, 2000)
    cache = ImageCache(tmp_path, budget_bytes=15 * MIB)
    with cache.lease(old) as lease:
        assert names(cache.images()) == ["new", "old"]  # leased just now: the most recent
        assert cache.state().in_use == 1
        assert cache.evict() == [new]
        image(tmp_path, "newer", 10, 3000)
        assert names(cache.evict()) == ["newer"]  # old is in use: over budget rather than evicted
        assert lease.image == old
    assert cache.state().in_use == 0
    assert cache.evict() == []  # old alone fits


def test_an_image_in_use_by_another_process_or_being_built_is_kept(tmp_path: Path):
    used, building, free = (image(tmp_path, name, 10, at) for name, at in (("used", 1), ("building", 2), ("free", 3)))
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys; from pathlib import Path; from prorl_server.imaging.image_cache import "
            f"ImageCache; lease = ImageCache(Path({str(tmp_path)!r})).lease(Path({str(used)!r})); print('ready', flush=True); "
            "sys.stdin.readline()",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    try:
        assert holder.stdout.readline().strip() == "ready"
        cache = ImageCache(tmp_path, budget_bytes=0)
        with _locked(building.with_suffix(".lock")):  # ImageBuilder.build holds it while it looks up or builds
            assert cache.state().in_use == 1
            assert cache.evict() == [free]
        assert cache.evict() == [building]
    finally:
        holder.communicate("\n", timeout=10)
    assert cache.evict() == [used]


def test_leasing_an_evicted_image_says_so_and_no_budget_evicts_nothing(tmp_path: Path):
    cache = ImageCache(tmp_path)
    kept = image(tmp_path, "kept", 10, 1)
    assert cache.evict() == [] and kept.exists()
    with pytest.raises(FileNotFoundError, match="not in the image cache"):
        cache.lease(tmp_path / "gone.sif")

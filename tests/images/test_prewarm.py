"""`prorl-server prewarm-images`: a dataset's images through the queue, a progress bar, a summary of what was
built, cached and failed (with reasons), exit status 1 on failures.

The counting tests build with a test double (`InstanceImagesDouble`: no apptainer, chosen outcomes); the
command-line test runs the real builder on Dockerfiles that fail in conversion, before any build starts.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from prorl_server import cli
from prorl_server.imaging import (
    BuildQueue,
    ImageBuilder,
    ImageBuildError,
    ImageCache,
    ImageSpec,
    InstanceImage,
    InstanceImages,
)
from prorl_server.prewarm import prewarm


class InstanceImagesDouble(InstanceImages):
    """Builds nothing: an image whose Dockerfile says `cached` is found, one that says `broken` fails."""

    def __init__(self, cache_dir: Path) -> None:
        super().__init__(ImageBuilder(cache_dir=cache_dir), BuildQueue(2), ImageCache(cache_dir))
        self.built: list[Path] = []

    def build(self, spec: ImageSpec) -> InstanceImage:
        self.built.append(spec.dockerfile)
        text = spec.dockerfile.read_text()
        if "broken" in text:
            raise ImageBuildError(f"{spec.dockerfile}:2: RUN failed the build: exit status 1\nthe log's tail")
        return InstanceImage(spec.dockerfile.with_suffix(".sif"), "/", "cached" in text, None, 0.0)


def dataset(root: Path, instances: list[dict], **dockerfiles: str) -> Path:
    """A JSONL dataset in `root` with Dockerfiles (directory name -> text) beside it."""
    for name, text in dockerfiles.items():
        (root / name).mkdir(parents=True)
        (root / name / "Dockerfile").write_text(text)
    path = root / "instances.jsonl"
    path.write_text("".join(json.dumps(instance) + "\n" for instance in instances) + "\n")
    return path


def test_prewarm_counts_built_cached_and_failed_images_with_a_progress_bar(tmp_path: Path, capsys):
    path = dataset(
        tmp_path / "data",
        [
            {"instance_id": "a-1", "dockerfile": "a/Dockerfile"},
            {"instance_id": "a-2", "dockerfile": "a/Dockerfile"},  # the same image: built once
            {"instance_id": "b-1", "dockerfile": "b/Dockerfile"},
            {"instance_id": "c-1", "dockerfile": "c/Dockerfile"},
            {"instance_id": "d-1", "dockerfile": "../escape/Dockerfile"},
            {"instance_id": "plain"},
        ],
        a="FROM x\n",
        b="FROM x\n# cached\n",
        c="FROM x\nRUN broken\n",
    )
    images = InstanceImagesDouble(tmp_path / "cache")
    summary = prewarm(path, images)
    assert (summary.built, summary.cached, summary.without_image) == (1, 1, 1)
    assert summary.failed.keys() == {"c-1", "d-1"}
    assert summary.failed["c-1"] == f"{path.parent / 'c/Dockerfile'}:2: RUN failed the build: exit status 1"
    assert "outside the dataset" in summary.failed["d-1"]
    assert sorted(images.built) == [path.parent / f"{name}/Dockerfile" for name in "abc"]


def test_the_progress_bar_counts_images(tmp_path: Path, capsys):
    path = dataset(tmp_path / "data", [{"dockerfile": "a/Dockerfile"}, {"dockerfile": "b/Dockerfile"}], a="A", b="B")
    prewarm(path, InstanceImagesDouble(tmp_path / "cache"))
    err = capsys.readouterr().err
    assert "images: 100%" in err and "2/2" in err
    prewarm(path, InstanceImagesDouble(tmp_path / "cache"), progress=False)
    assert capsys.readouterr().err == ""


def test_the_command_prints_the_summary_and_exits_1_on_a_failure(tmp_path: Path, capsys):
    path = dataset(
        tmp_path / "data",
        [{"instance_id": "shell", "dockerfile": "shell/Dockerfile"}, {"instance_id": "plain"}, "not an object"],
        shell='FROM debian:bookworm\nSHELL ["/bin/bash", "-c"]\n',
    )
    argv = ["prewarm-images", str(path), "--cache-dir", str(tmp_path / "cache"), "--cache-budget-gb", "1"]
    with pytest.raises(SystemExit) as exit_:
        cli.main([*argv, "--no-progress"])
    assert exit_.value.code == 1
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "built 0, cached 0, failed 2 (1 instances without an image of their own)"
    assert out[1] == "failed: instances.jsonl:3: not a JSON object"
    assert out[2] == f"failed: shell: {path.parent / 'shell/Dockerfile'}:2: SHELL: not supported: " + (
        "Apptainer builds run each RUN with /bin/sh -c; write the shell into the RUN (bash -c '...')"
    )
    assert out[3] == f"cache {tmp_path / 'cache'}: 0 images, 0.00 GiB, 0 in use, budget 1.00 GiB"

    path.write_text(json.dumps({"instance_id": "plain"}) + "\n")
    cli.main([*argv, "--no-progress"])  # nothing failed: no exit
    assert capsys.readouterr().out.startswith("built 0, cached 0, failed 0 (1 instances without")

"""Per-instance images: an instance's Dockerfile paths checked against its dataset's directory, and a real
build of a repository base plus an instance layer on it (`Bootstrap: localimage`), the second request cached.

The real build maps FROM debian:bookworm to the local base of scripts/setup-apptainer.sh and is skipped with
the reason when apptainer or that base is missing.
"""

from __future__ import annotations

import json
import socket
import subprocess
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from prorl_handlers.swe import SWEHandler, load_instances
from repo_paths import EXAMPLES

from prorl_server import cli
from prorl_server.imaging import (
    DEFAULTS,
    BuildQueue,
    ImageBuilder,
    ImageCache,
    ImageSpec,
    ImageSpecError,
    InstanceImages,
)
from prorl_server.sandbox.apptainer import find_apptainer
from prorl_server.sandbox.registry import unavailable_reason

EXAMPLES = EXAMPLES / "swe-images"
BWRAP = unavailable_reason("bwrap")


def call(name: str, **arguments: Any) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


def mirror_reason() -> str | None:
    """Why Debian's mirror cannot be reached (the shipped base installs git and pytest from it), or None."""
    host = urlsplit(DEFAULTS["mirror"]).hostname or ""
    try:
        socket.create_connection((host, 80), timeout=5).close()
    except OSError as exc:
        return f"the shipped textkit base installs git and pytest from {DEFAULTS['mirror']}: {exc}"
    return None


def files(root: Path, **texts: str) -> Path:
    """Write `texts` (relative path with __ for / -> content) under `root`; returns `root`."""
    for name, text in texts.items():
        path = root / name.replace("__", "/")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def test_an_instance_names_dockerfiles_inside_its_dataset_only(tmp_path: Path):
    dataset = files(tmp_path / "data", images__one__Dockerfile="FROM base\n", images__base__Dockerfile="FROM x\n")
    files(tmp_path, outside__Dockerfile="FROM x\n")
    (dataset / "link").symlink_to(tmp_path / "outside")
    spec = ImageSpec.from_instance(
        {"dockerfile": "images/one/Dockerfile", "base_dockerfile": "images/base/Dockerfile"}, dataset
    )
    assert spec == ImageSpec(dataset / "images/one/Dockerfile", dataset / "images/base/Dockerfile")
    assert ImageSpec.from_instance({}, dataset) is None
    refused = {
        "../outside/Dockerfile": "outside the dataset",
        str(tmp_path / "outside/Dockerfile"): "outside the dataset",
        "link/Dockerfile": "outside the dataset",
        "images/two/Dockerfile": "no such file",
        "images/one": "no such file",
    }
    for name, why in refused.items():
        with pytest.raises(ImageSpecError, match=why):
            ImageSpec.from_instance({"dockerfile": name}, dataset)
    with pytest.raises(ImageSpecError, match="relative to the dataset"):
        ImageSpec.from_instance({"dockerfile": 3}, dataset)
    with pytest.raises(ImageSpecError, match="base_dockerfile needs a dockerfile"):
        ImageSpec.from_instance({"base_dockerfile": "images/base/Dockerfile"}, dataset)


def test_the_swe_handler_checks_image_fields_and_the_examples_pass(tmp_path: Path):
    handler = SWEHandler(dataset_dir=EXAMPLES)
    examples = load_instances(EXAMPLES / "instances.jsonl")
    assert [instance["instance_id"] for instance in examples] == ["textkit-1", "textkit-2"]
    for instance in examples:
        handler.validate_instance(instance)
    escaping = {**examples[0], "dockerfile": "../../images/example/Dockerfile"}
    with pytest.raises(ValueError, match="outside the dataset"):
        handler.validate_instance(escaping)
    plain = {key: value for key, value in examples[0].items() if "dockerfile" not in key}
    handler.validate_instance(plain)  # without a dockerfile: the server's default sandbox, as before


async def test_an_instance_layer_builds_on_its_repository_base_and_is_cached(base: Path, tmp_path: Path, capsys):
    dataset = files(
        tmp_path / "data",
        images__repo__Dockerfile="FROM debian:bookworm\nRUN echo from-the-base > /opt/base.txt\n",
        images__one__Dockerfile="FROM repo-base\nWORKDIR /srv\nRUN cp /opt/base.txt one.txt && echo one >> one.txt\n",
    )
    spec = ImageSpec.from_instance(
        {"dockerfile": "images/one/Dockerfile", "base_dockerfile": "images/repo/Dockerfile"}, dataset
    )
    assert spec is not None
    cache_dir = tmp_path / "cache"
    cache = ImageCache(cache_dir)
    images = InstanceImages(ImageBuilder(cache_dir=cache_dir), BuildQueue(2), cache, {"debian:bookworm": base})
    first, lease = await images.acquire(spec)
    with lease:
        assert (first.cached, first.base_cached, first.workdir) == (False, False, "/srv")
        again, second_lease = await images.acquire(spec)
        second_lease.release()
        assert (again.path, again.cached, again.base_cached) == (first.path, True, True)
        state = cache.state()
        assert (state.images, state.in_use) == (2, 1)  # the base and the instance layer; the layer is leased
    shown = subprocess.run(
        [str(find_apptainer()), "exec", str(first.path), "cat", "/srv/one.txt"], capture_output=True, text=True
    )
    assert shown.stdout.splitlines() == ["from-the-base", "one"], shown.stderr

    (dataset / "instances.jsonl").write_text(
        '{"instance_id": "one", "dockerfile": "images/one/Dockerfile", "base_dockerfile": "images/repo/Dockerfile"}\n'
    )
    argv = ["prewarm-images", str(dataset / "instances.jsonl"), "--cache-dir", str(cache_dir), "--no-progress"]
    cli.main([*argv, "--base-map", f"debian:bookworm={base}"])
    assert (
        capsys.readouterr().out.splitlines()[0]
        == "built 0, cached 1, failed 0 (0 instances without an image of their own)"
    )


def test_a_shipped_instance_runs_in_its_own_image_through_the_swe_handler(
    base: Path, tmp_path: Path, start_server, backend
):
    """examples/swe-images' textkit-1 through a server: its base (git and pytest from Debian) and layer built in
    INIT, the agent's gold fix applied in a sandbox of the image, the tests run in a fresh one in EVAL."""
    if BWRAP is not None or (reason := mirror_reason()) is not None:
        pytest.skip(f"bwrap: {BWRAP}" if BWRAP else reason)
    instance = load_instances(EXAMPLES / "instances.jsonl")[0]
    fix = f"cd /workspace/textkit && git apply <<'PATCH'\n{instance['patch']}PATCH\ngit --version; head -1 /etc/debian_version"
    backend.double.push(call("bash", command=fix), call("submit"))
    handler = SWEHandler(dataset_dir=EXAMPLES, base_map={"debian:bookworm": base}, cache_dir=tmp_path / "cache")
    server = start_server([backend.address], handlers={"swe": handler}, runtime="bwrap")
    result = server.http.post("/process", json={"instance": instance}, timeout=600).json()
    assert result["status"] == "completed", result
    assert result["reward"] == 1.0, result["eval"]
    assert result["artifacts"]["patch"] == instance["patch"]
    assert result["artifacts"]["image"]["cached"] is False and result["artifacts"]["image"]["base_cached"] is False
    observation = next(m["content"] for m in result["trajectory"]["messages"] if m["role"] == "tool")
    assert "git version" in observation

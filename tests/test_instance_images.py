"""Per-instance images: an instance's Dockerfile paths checked against its dataset's directory, and a real
build of a repository base plus an instance layer on it (`Bootstrap: localimage`), the second request cached.

The real build maps FROM debian:bookworm to the local base of scripts/setup-apptainer.sh and is skipped with
the reason when apptainer or that base is missing.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from prorl_handlers.swe import SWEHandler, load_instances

from prorl_server import cli
from prorl_server.sandbox.apptainer import ENV_BINARY, find_apptainer
from prorl_server.sandbox.build_queue import BuildQueue
from prorl_server.sandbox.image_cache import ImageCache
from prorl_server.sandbox.images import ImageBuilder
from prorl_server.sandbox.instance_images import ImageSpec, ImageSpecError, InstanceImages

EXAMPLES = Path(__file__).resolve().parent.parent / "examples" / "swe-images"
BASES = (Path("/tmp/apptainer-test/imgroot"), Path("/tmp/apptainer-test/images/py.sif"))


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


@pytest.fixture(scope="module")
def base() -> Path:
    """The local base image of scripts/setup-apptainer.sh (skips without apptainer or a base)."""
    if find_apptainer() is None:
        pytest.skip(f"needs apptainer (PATH or {ENV_BINARY}); as root: bash scripts/setup-apptainer.sh")
    found = next((b for b in BASES if b.exists()), None)
    if found is None:
        pytest.skip(f"needs a base image, one of {[str(b) for b in BASES]}: bash scripts/setup-apptainer.sh")
    return found


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

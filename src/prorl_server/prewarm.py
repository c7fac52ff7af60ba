"""`prorl-server prewarm-images`: build the images of a dataset's instances ahead of training.

Each line of the JSONL dataset is an instance; one that names a `dockerfile` (and maybe a `base_dockerfile`,
paths relative to the dataset's directory, see `imaging/instance_images.py`) has its image built, at most
`--concurrency` at once, into the image cache, within `--cache-budget-gb`. A progress bar counts the images;
the summary says how many were built, found cached and failed (with each failure's instances and reason),
and the exit status is 1 when any failed.
"""

from __future__ import annotations

import argparse
import json
import sys
from concurrent.futures import as_completed
from dataclasses import dataclass, field
from pathlib import Path

from tqdm import tqdm

from prorl_server.imaging import (
    DEFAULTS,
    IMAGE_CACHE_DIR,
    BuildQueue,
    ImageBuilder,
    ImageBuildError,
    ImageCache,
    ImageSpec,
    ImageSpecError,
    InstanceImages,
    parse_mapping,
)

GIB = 1 << 30


@dataclass
class Summary:
    """What a prewarm did: images built and found cached, instances without an image, failures."""

    built: int = 0
    cached: int = 0
    without_image: int = 0
    failed: dict[str, str] = field(default_factory=dict)  # instances (comma-separated) -> reason


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of `prewarm-images`."""
    parser.add_argument(
        "dataset", type=Path, help="a JSONL file of instances; Dockerfile paths are relative to its directory"
    )
    parser.add_argument("--concurrency", type=int, default=2, help="image builds at once, at most")
    parser.add_argument("--cache-dir", type=Path, default=IMAGE_CACHE_DIR)
    parser.add_argument(
        "--cache-budget-gb",
        type=float,
        help="keep the cache's .sif files within this many GiB (least recently used out)",
    )
    parser.add_argument(
        "--base-map",
        action="append",
        default=[],
        metavar="IMAGE=PATH",
        help="build a Dockerfile's FROM IMAGE on this local .sif or root directory",
    )
    parser.add_argument("--mirror", default=DEFAULTS["mirror"], help="Debian mirror of a debootstrapped FROM")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")


def read_specs(dataset: Path, summary: Summary) -> dict[ImageSpec, list[str]]:
    """The image specs of the dataset's instances, each with the instances that use it; a malformed line or
    image field is a failure in `summary`."""
    specs: dict[ImageSpec, list[str]] = {}
    with dataset.open(encoding="utf-8") as lines:
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            name = f"{dataset.name}:{number}"
            try:
                instance = json.loads(line)
                if not isinstance(instance, dict):
                    raise ImageSpecError("not a JSON object")
                name = str(instance.get("instance_id", name))
                spec = ImageSpec.from_instance(instance, dataset.parent)
            except ValueError as exc:  # not JSON, or an image field ImageSpec refuses
                summary.failed[name] = str(exc)
                continue
            if spec is None:
                summary.without_image += 1
            else:
                specs.setdefault(spec, []).append(name)
    return specs


def prewarm(dataset: Path, images: InstanceImages, progress: bool = True) -> Summary:
    """Build the images of the dataset's instances through `images`' queue; what happened."""
    summary = Summary()
    specs = read_specs(dataset, summary)
    futures = {images.submit(spec): names for spec, names in specs.items()}
    with tqdm(total=len(futures), desc="images", unit="image", disable=not progress, file=sys.stderr) as bar:
        for future in as_completed(futures):
            try:
                image = future.result()
            except Exception as exc:  # any reason a build failed is reported, and the others go on
                summary.failed[", ".join(futures[future])] = str(exc).splitlines()[0]
            else:
                if image.cached:
                    summary.cached += 1
                else:
                    summary.built += 1
            bar.update()
    return summary


def run_from_args(args: argparse.Namespace) -> None:
    """Run `prewarm-images`: the progress bar and the summary; exit status 1 when an image failed."""
    try:
        base_map = {name: Path(path) for name, path in parse_mapping(args.base_map, "--base-map").items()}
        budget = None if args.cache_budget_gb is None else int(args.cache_budget_gb * GIB)
        builder = ImageBuilder(cache_dir=args.cache_dir)
        cache = ImageCache(args.cache_dir, budget)
        images = InstanceImages(builder, BuildQueue(args.concurrency), cache, base_map, args.mirror)
        summary = prewarm(args.dataset, images, progress=not args.no_progress)
    except (ImageBuildError, ValueError, OSError) as exc:
        sys.exit(f"prorl-server prewarm-images: {exc}")
    print(f"built {summary.built}, cached {summary.cached}, failed {len(summary.failed)}", end="")
    print(f" ({summary.without_image} instances without an image of their own)")
    for names, reason in summary.failed.items():
        print(f"failed: {names}: {reason}")
    state = cache.state()
    budget = "no budget" if state.budget_bytes is None else f"budget {state.budget_bytes / GIB:.2f} GiB"
    print(
        f"cache {args.cache_dir}: {state.images} images, {state.bytes / GIB:.2f} GiB, {state.in_use} in use, {budget}"
    )
    if summary.failed:
        sys.exit(1)
